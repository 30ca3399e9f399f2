package integrity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/snapshotfs"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// sourceDamage is what a walk found of one source.
type sourceDamage struct {
	src snapshot.SourceInfo
	// damaged are its snapshots that reference lost data, oldest first.
	damaged []*snapshot.Manifest
	// files are the objects whose data is lost, counted once.
	files map[object.ID]bool
	// healing: a snapshot its client's next one builds on is damaged.
	healing bool
}

// damage is what a walk found: the sources with damaged snapshots.
type damage struct {
	sources   []*sourceDamage
	snapshots int
}

// walker checks snapshots' trees, each directory object once.
type walker struct {
	rep repo.DirectRepository
	// pending are the contents the verifier dropped that the index still
	// holds as deleted; stored the storage's packs and their lengths.
	pending map[content.ID]loss
	stored  map[blob.ID]int64
	// dirs holds, for each directory object walked, the objects under it
	// whose data is lost (empty when none).
	dirs map[object.ID][]object.ID
	// victims are contents Kopia's garbage collection deleted, whose
	// pack the storage still holds, that a snapshot references.
	victims map[content.ID]bool
}

func newWalker(rep repo.DirectRepository, pending map[content.ID]loss, stored map[blob.ID]int64) *walker {
	return &walker{rep: rep, pending: pending, stored: stored, dirs: map[object.ID][]object.ID{}, victims: map[content.ID]bool{}}
}

// walk finds the snapshots that reference a content that is lost: absent
// from the index, dropped by the verifier (pending), or deleted with its
// pack gone. A content Kopia's garbage collection deleted whose pack is
// still there is not lost: it is returned among the victims, which
// Kopia's next collection would undelete.
func walk(ctx context.Context, dr repo.DirectRepository, pending map[content.ID]loss, stored map[blob.ID]int64) (*damage, map[content.ID]bool, error) {
	// A snapshot written meanwhile may reference what was dropped.
	if err := dr.Refresh(ctx); err != nil {
		return nil, nil, fmt.Errorf("refresh the index: %w", err)
	}
	entries, err := dr.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: snapshot.ManifestType})
	if err != nil {
		return nil, nil, fmt.Errorf("list snapshots: %w", err)
	}
	// A snapshot belongs to the source its labels name, which Kopia's
	// access rules hold to the writer's own identity, never to the one its
	// payload names: a guest writes that as it likes, and would otherwise
	// have another VM told of its damage, sent its rehash notices, and
	// given its settled rewrite (which Kopia saves under m.Source).
	sourceOf := make(map[manifest.ID]snapshot.SourceInfo, len(entries))
	ids := make([]manifest.ID, 0, len(entries))
	for _, e := range entries {
		sourceOf[e.ID] = snapshot.SourceInfo{UserName: e.Labels[snapshot.UsernameLabel], Host: e.Labels[snapshot.HostnameLabel], Path: e.Labels[snapshot.PathLabel]}
		ids = append(ids, e.ID)
	}
	manifests, err := snapshot.LoadSnapshots(ctx, dr, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("load snapshots: %w", err)
	}
	w := newWalker(dr, pending, stored)
	bySource := map[snapshot.SourceInfo][]*snapshot.Manifest{}
	for _, m := range manifests {
		m.Source = sourceOf[m.ID]
		bySource[m.Source] = append(bySource[m.Source], m)
	}
	d := &damage{}
	for src, ms := range bySource {
		slices.SortFunc(ms, func(a, b *snapshot.Manifest) int { return a.StartTime.ToTime().Compare(b.StartTime.ToTime()) })
		sd := &sourceDamage{src: src, files: map[object.ID]bool{}}
		damagedIDs := map[*snapshot.Manifest]bool{}
		for _, m := range ms {
			bad, err := w.snapshot(ctx, m)
			if err != nil {
				return nil, nil, err
			}
			if len(bad) == 0 {
				continue
			}
			sd.damaged = append(sd.damaged, m)
			damagedIDs[m] = true
			for _, oid := range bad {
				sd.files[oid] = true
			}
		}
		if len(sd.damaged) == 0 {
			continue
		}
		for _, m := range bases(ms) {
			sd.healing = sd.healing || damagedIDs[m]
		}
		d.sources = append(d.sources, sd)
		d.snapshots += len(sd.damaged)
	}
	return d, w.victims, nil
}

// bases are the snapshots a client's next snapshot of the source builds
// on, as Kopia's snapshot.FindPreviousManifests picks them from ms
// (sorted by start time): the latest complete one and every incomplete
// one after it. Their files are not read again if unchanged.
func bases(ms []*snapshot.Manifest) []*snapshot.Manifest {
	last := -1
	for i, m := range ms {
		if m.IncompleteReason == "" {
			last = i
		}
	}
	var out []*snapshot.Manifest
	for i, m := range ms {
		if i == last || (i > last && m.IncompleteReason != "") {
			out = append(out, m)
		}
	}
	return out
}

// snapshot is the objects of m whose data is lost.
func (w *walker) snapshot(ctx context.Context, m *snapshot.Manifest) ([]object.ID, error) {
	if m.RootEntry == nil {
		return nil, nil
	}
	if m.RootEntry.Type == snapshot.EntryTypeDirectory {
		return w.dir(ctx, m.RootEntry.ObjectID)
	}
	ok, err := w.whole(ctx, m.RootEntry.ObjectID)
	if err != nil || ok {
		return nil, err
	}
	return []object.ID{m.RootEntry.ObjectID}, nil
}

// dir is the objects under directory object oid whose data is lost: oid
// itself when it cannot be read.
func (w *walker) dir(ctx context.Context, oid object.ID) ([]object.ID, error) {
	if bad, ok := w.dirs[oid]; ok {
		return bad, nil
	}
	ok, err := w.whole(ctx, oid)
	if err != nil {
		return nil, err
	}
	bad := []object.ID{}
	if !ok {
		bad = append(bad, oid)
		w.dirs[oid] = bad
		return bad, nil
	}
	entries, err := w.entries(ctx, oid)
	if err != nil {
		// The directory's contents are present but do not read back: a
		// read that failed for a passing reason fails the pass instead.
		if errors.Is(err, errUnreadable) {
			bad = append(bad, oid)
			w.dirs[oid] = bad
			return bad, nil
		}
		return nil, err
	}
	seen := map[object.ID]bool{}
	for _, e := range entries {
		if e.Type == snapshot.EntryTypeDirectory {
			sub, err := w.dir(ctx, e.ObjectID)
			if err != nil {
				return nil, err
			}
			// Each lost object once, and at most maxListedObjects: a
			// guest can write directories that list one child many
			// times, which would otherwise grow this without bound.
			for _, oid := range sub {
				if !seen[oid] && len(bad) < maxListedObjects {
					seen[oid] = true
					bad = append(bad, oid)
				}
			}
			continue
		}
		ok, err := w.whole(ctx, e.ObjectID)
		if err != nil {
			return nil, err
		}
		if !ok {
			bad = append(bad, e.ObjectID)
		}
	}
	w.dirs[oid] = bad
	return bad, nil
}

// maxListedObjects bounds the lost objects a directory's walk keeps: the
// Files a state reports is at most that per directory.
const maxListedObjects = 10000

// errUnreadable marks a directory whose data did not decode.
var errUnreadable = errors.New("directory does not read back")

// entries reads directory object oid.
func (w *walker) entries(ctx context.Context, oid object.ID) ([]*snapshot.DirEntry, error) {
	iter, err := snapshotfs.DirectoryEntry(w.rep, oid, nil).Iterate(ctx)
	if err != nil {
		return nil, w.readError(ctx, oid, err)
	}
	defer iter.Close()
	var out []*snapshot.DirEntry
	for {
		e, err := iter.Next(ctx)
		if err != nil {
			return nil, w.readError(ctx, oid, err)
		}
		if e == nil {
			return out, nil
		}
		if de, ok := e.(snapshot.HasDirEntry); ok {
			out = append(out, de.DirEntry())
		}
	}
}

// readError tells a directory that does not decode (errUnreadable) from
// a pass that could not read it.
func (w *walker) readError(ctx context.Context, oid object.ID, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, content.ErrContentNotFound) || errors.Is(err, object.ErrObjectNotFound) || undecodable(err) {
		return fmt.Errorf("%w: %s: %w", errUnreadable, oid, err)
	}
	return fmt.Errorf("read directory %s: %w", oid, err)
}

// undecodable is whether err says that data the storage returned did not
// decrypt or parse, as opposed to the storage not answering. Kopia's
// errors carry no type for it, only their words.
func undecodable(err error) bool {
	msg := err.Error()
	for _, s := range []string{"invalid checksum", "decrypt", "error decompressing", "unsupported compressor", "invalid directory", "unable to parse", "invalid indirect object"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// whole is whether every content behind oid is in the index, not
// dropped, and not among those lost.
func (w *walker) whole(ctx context.Context, oid object.ID) (bool, error) {
	cr := w.rep.ContentReader()
	ids, err := object.VerifyObject(ctx, contents{w.rep}, oid)
	if err != nil {
		// An indirect object's list of contents is data too: one that is
		// gone or does not read back leaves the object unreadable.
		if errors.Is(err, content.ErrContentNotFound) || errors.Is(err, object.ErrObjectNotFound) || undecodable(err) {
			return false, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, fmt.Errorf("object %s: %w", oid, err)
	}
	for _, id := range ids {
		if _, dropped := w.pending[id]; dropped {
			return false, nil
		}
		ci, err := cr.ContentInfo(ctx, id)
		switch {
		case errors.Is(err, content.ErrContentNotFound):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("content %s of object %s: %w", id, oid, err)
		case !ci.Deleted:
			continue
		}
		held, err := w.holds(ctx, ci.PackBlobID)
		if err != nil {
			return false, err
		}
		if !held {
			return false, nil
		}
		w.victims[id] = true
	}
	return true, nil
}

// holds is whether the storage still holds pack.
func (w *walker) holds(ctx context.Context, pack blob.ID) (bool, error) {
	if _, ok := w.stored[pack]; ok {
		return true, nil
	}
	_, err := w.rep.BlobReader().GetMetadata(ctx, pack)
	switch {
	case errors.Is(err, blob.ErrBlobNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("pack %s: %w", pack, err)
	default:
		return true, nil
	}
}

// summary is what the state lists of the damage: the sources with the
// most recent damage first, at most maintenancestate.MaxListedSources.
func (d *damage) summary() (int, []maintenancestate.DamagedSource) {
	if d == nil || len(d.sources) == 0 {
		return 0, nil
	}
	out := make([]maintenancestate.DamagedSource, 0, len(d.sources))
	for _, s := range d.sources {
		ds := maintenancestate.DamagedSource{
			User: s.src.UserName, Host: s.src.Host, Path: s.src.Path,
			Snapshots: len(s.damaged), Files: len(s.files), Healing: s.healing,
			Oldest: s.damaged[0].StartTime.ToTime().UTC(),
			Newest: s.damaged[len(s.damaged)-1].StartTime.ToTime().UTC(),
		}
		for i := len(s.damaged) - 1; i >= 0 && len(ds.IDs) < maintenancestate.MaxListedSnapshots; i-- {
			ds.IDs = append(ds.IDs, string(s.damaged[i].ID))
		}
		out = append(out, ds)
	}
	slices.SortFunc(out, func(a, b maintenancestate.DamagedSource) int {
		if c := b.Newest.Compare(a.Newest); c != 0 {
			return c
		}
		return strings.Compare(a.User+"@"+a.Host+":"+a.Path, b.User+"@"+b.Host+":"+b.Path)
	})
	if len(out) > maintenancestate.MaxListedSources {
		out = out[:maintenancestate.MaxListedSources]
	}
	return d.snapshots, out
}

// contents reads a repository's contents as package object does.
type contents struct{ repo.DirectRepository }

func (c contents) GetContent(ctx context.Context, id content.ID) ([]byte, error) {
	return c.ContentReader().GetContent(ctx, id)
}
