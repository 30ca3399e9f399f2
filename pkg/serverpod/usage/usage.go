// Package usage measures what each VM stores in its BSLS's Kopia
// repository, for a per-VM quota and the server pod's /metrics.
//
// Definition. A user's usage (a VM's guest is one Kopia user, user@host)
// is the packed size of every distinct content reachable from any of the
// user's snapshots, complete or incomplete, of all its sources (paths).
// The packed size of a content is its length in its pack, after
// compression and encryption, as the index records it: what the storage
// holds for it. The contents reachable from a snapshot are those of its
// directory objects, of its file (and symlink) objects, and, for an
// object Kopia split into chunks (an indirect object), both the chunks it
// lists and the contents of that list itself.
//
// Usage is deduplicated within a user and not across users. A content
// counts once for a user however many of its snapshots, sources, files or
// directories reference it: a file kept unchanged in 30 daily snapshots
// counts once. A content that two users both reference counts in full to
// each, although the storage holds it once: so a guest can neither lower
// its own usage nor raise another's by storing data another guest stores
// too, and one guest's usage does not depend on what the others store.
// The sum of the users' usages can therefore exceed what the storage
// holds; it also leaves out what no snapshot references (manifests, data
// that Kopia's maintenance has yet to collect).
//
// A content the index marks deleted still counts while a snapshot
// references it: the storage holds it until maintenance drops it, and a
// snapshot that references it has Kopia's maintenance undelete it. A
// content the index does not hold counts nothing, and a directory (or a
// list of an indirect object) whose data does not read back, its pack
// gone or damaged, counts its own contents as the index holds them but
// not what it lists, which cannot be known: the integrity verifier
// (pkg/serverpod/integrity) reports such damage and has the guest upload
// the data again. One damaged snapshot never fails the measurement; a
// storage that does not answer does.
//
// Cost. Measure reads the snapshot manifests, which Kopia holds in
// memory, then walks each user's snapshots in turn: each distinct
// directory object and each list of an indirect object is read once per
// user (a directory unchanged between snapshots is read once), and each
// content's size is looked up in the index Kopia holds in memory. File
// data is never read. Memory holds one user's sets of objects and
// contents at a time. A guest that writes a directory listing the same
// child many times, or a very deep tree, costs a lookup per listed entry
// and no recursion: the walk keeps an explicit stack of the objects not
// yet read, each at most once. A Collector serves the last result to
// every scrape: measure on a cadence, never per scrape.
package usage

import (
	"context"
	"errors"
	"fmt"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/format"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/snapshotfs"
)

// Measure returns, for each Kopia user (user@host) with snapshots in r,
// the bytes the storage holds for it, as the package comment defines
// them, as of r's last refresh (the caller refreshes). A user without
// snapshots is absent. It fails when the snapshots cannot be listed, the
// index cannot be read, or the storage does not answer.
func Measure(ctx context.Context, r repo.DirectRepository) (map[string]int64, error) {
	walks, err := measure(ctx, r)
	if err != nil {
		return nil, err
	}
	usage := make(map[string]int64, len(walks))
	for user, w := range walks {
		usage[user] = w.bytes
	}
	return usage, nil
}

// measure walks each user's snapshots and returns the walks' results
// (their sets dropped).
func measure(ctx context.Context, r repo.DirectRepository) (map[string]walked, error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: snapshot.ManifestType})
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	// A snapshot counts to the user its labels name, which Kopia's access
	// rules hold to the writer's own identity, never to the source its
	// payload names: a guest writes that as it likes, and would charge
	// its data to another VM.
	ownerOf := make(map[manifest.ID]string, len(entries))
	ids := make([]manifest.ID, 0, len(entries))
	for _, e := range entries {
		ownerOf[e.ID] = e.Labels[snapshot.UsernameLabel] + "@" + e.Labels[snapshot.HostnameLabel]
		ids = append(ids, e.ID)
	}
	manifests, err := snapshot.LoadSnapshots(ctx, r, ids)
	if err != nil {
		return nil, fmt.Errorf("load snapshots: %w", err)
	}
	byUser := map[string][]*snapshot.Manifest{}
	for _, m := range manifests {
		user := ownerOf[m.ID]
		byUser[user] = append(byUser[user], m)
	}
	out := make(map[string]walked, len(byUser))
	for user, ms := range byUser {
		// A fresh walk: one user's sets in memory at a time, and
		// nothing one user references counted as another's.
		w := newWalk(r)
		for _, m := range ms {
			if m.RootEntry == nil {
				continue
			}
			if err := w.push(ctx, m.RootEntry.ObjectID, m.RootEntry.Type == snapshot.EntryTypeDirectory); err != nil {
				return nil, fmt.Errorf("measure %s: %w", user, err)
			}
		}
		if err := w.run(ctx); err != nil {
			return nil, fmt.Errorf("measure %s: %w", user, err)
		}
		out[user] = w.walked
	}
	return out, nil
}

// walked is what a walk found of one user.
type walked struct {
	// bytes is the user's usage.
	bytes int64
	// reads counts the directories and lists of indirect objects read:
	// the walk's work, which tests hold to each object once.
	reads int
}

// item is an object the walk has yet to read: a directory, or an
// indirect object (whose list it reads).
type item struct {
	oid object.ID
	dir bool
}

// walk measures one user.
type walk struct {
	rep repo.DirectRepository
	// seen are the directories and indirect objects pushed, each read
	// once; contents are the contents counted (or absent from the index).
	seen     map[object.ID]struct{}
	contents map[content.ID]struct{}
	stack    []item
	walked
}

func newWalk(rep repo.DirectRepository) *walk {
	return &walk{rep: rep, seen: map[object.ID]struct{}{}, contents: map[content.ID]struct{}{}}
}

// push counts a direct file object's content at once and stacks a
// directory or indirect object not seen before, so that the stack holds
// each object at most once however often the tree lists it.
func (w *walk) push(ctx context.Context, oid object.ID, dir bool) error {
	if oid == object.EmptyID {
		return nil
	}
	if cid, _, direct := oid.ContentID(); direct && !dir {
		return w.count(ctx, cid)
	}
	if _, ok := w.seen[oid]; ok {
		return nil
	}
	w.seen[oid] = struct{}{}
	w.stack = append(w.stack, item{oid: oid, dir: dir})
	return nil
}

// run reads the stacked objects until none is left.
func (w *walk) run(ctx context.Context) error {
	for len(w.stack) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		it := w.stack[len(w.stack)-1]
		w.stack = w.stack[:len(w.stack)-1]
		if err := w.object(ctx, it); err != nil {
			return err
		}
	}
	return nil
}

// object counts the contents of it and stacks what it lists.
func (w *walk) object(ctx context.Context, it item) error {
	if cid, _, direct := it.oid.ContentID(); direct {
		if err := w.count(ctx, cid); err != nil {
			return err
		}
	} else {
		index, _ := it.oid.IndexObjectID()
		// The list is an object of its own, whose contents count too.
		if err := w.push(ctx, index, false); err != nil {
			return err
		}
		w.reads++
		chunks, err := object.LoadIndexObject(ctx, contents{w.rep}, index)
		if err != nil {
			// What the list names cannot be known, nor can a directory
			// made of those chunks be read.
			return w.unreadable(ctx, it.oid, err)
		}
		for _, c := range chunks {
			if err := w.push(ctx, c.Object, false); err != nil {
				return err
			}
		}
	}
	if !it.dir {
		return nil
	}
	return w.dir(ctx, it.oid)
}

// dir stacks the entries of directory oid.
func (w *walk) dir(ctx context.Context, oid object.ID) error {
	w.reads++
	iter, err := snapshotfs.DirectoryEntry(w.rep, oid, nil).Iterate(ctx)
	if err != nil {
		return w.unreadable(ctx, oid, err)
	}
	defer iter.Close()
	for {
		e, err := iter.Next(ctx)
		if err != nil {
			return w.unreadable(ctx, oid, err)
		}
		if e == nil {
			return nil
		}
		de, ok := e.(snapshot.HasDirEntry)
		if !ok {
			continue
		}
		entry := de.DirEntry()
		if err := w.push(ctx, entry.ObjectID, entry.Type == snapshot.EntryTypeDirectory); err != nil {
			return err
		}
	}
}

// count adds content id's packed length, once.
func (w *walk) count(ctx context.Context, id content.ID) error {
	if _, ok := w.contents[id]; ok {
		return nil
	}
	info, err := w.rep.ContentInfo(ctx, id)
	switch {
	case errors.Is(err, content.ErrContentNotFound):
		// The storage holds nothing for it that the index knows of.
	case err != nil:
		return fmt.Errorf("look up content %s in the index: %w", id, err)
	default:
		w.bytes += int64(info.PackedLength)
	}
	w.contents[id] = struct{}{}
	return nil
}

// unreadable decides about object oid, which did not read back with err:
// nil (the walk goes on without what oid lists) when the data is damaged
// or gone, err when the storage does not answer. Kopia's errors do not
// tell a pack that does not decrypt from a storage that failed to send
// it, so the storage is asked for the repository's format blob, which
// it always holds: if it answers, the failure was the data's. A read that
// failed for a passing reason just before a probe that succeeds counts
// as damage, until the next measurement.
func (w *walk) unreadable(ctx context.Context, oid object.ID, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// Absent from the index: the storage was not asked.
	if errors.Is(err, content.ErrContentNotFound) || errors.Is(err, object.ErrObjectNotFound) {
		return nil
	}
	if _, perr := w.rep.BlobReader().GetMetadata(ctx, format.KopiaRepositoryBlobID); perr != nil {
		return fmt.Errorf("read object %s: %w (and the storage does not answer for %s: %w)", oid, err, format.KopiaRepositoryBlobID, perr)
	}
	return nil
}

// contents reads a repository's contents as package object does.
type contents struct{ repo.DirectRepository }

func (c contents) GetContent(ctx context.Context, id content.ID) ([]byte, error) {
	return c.ContentReader().GetContent(ctx, id)
}
