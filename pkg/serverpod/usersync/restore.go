package usersync

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/snapshotfs"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// restoreRefusal is why a restore cannot be carried out, in words its requester
// can act on: the request fails with it.
type restoreRefusal string

// restorePlan chooses, for each path of restore request r, the snapshot
// of r.Source it is restored from (r.SnapshotID, else the last complete
// one started before r.Before, else the latest), among the snapshots of
// the source's snapshot source that holds the path: the longest source
// path that is the path or a folder above it. The server pod chooses, not
// the guest, so that what the request's status names is what the
// repository holds under the source's identity. A refusal says why the
// request cannot be carried out; an error, that the repository could not
// be read.
func restorePlan(ctx context.Context, rep repo.Repository, r userset.Request) ([]restoreStep, restoreRefusal, error) {
	user, host, _ := strings.Cut(r.Source, "@")
	sources, err := sourcesOf(ctx, rep, r.Source)
	if err != nil {
		return nil, "", err
	}
	var chosen *snapshot.Manifest
	if r.SnapshotID != "" {
		m := &snapshot.Manifest{}
		em, err := rep.GetManifest(ctx, manifest.ID(r.SnapshotID), m)
		switch {
		case errors.Is(err, manifest.ErrNotFound) || err == nil && (em.Labels[manifest.TypeLabelKey] != snapshot.ManifestType ||
			em.Labels[snapshot.UsernameLabel] != user || em.Labels[snapshot.HostnameLabel] != host):
			// The same words whether the ID is unknown, another
			// identity's or no snapshot's: a request learns nothing of
			// what else the repository holds.
			return nil, restoreRefusal(fmt.Sprintf("%s has no snapshot %s: give an ID that guestbackup-kopia snapshot list prints in its guest, or choose by time", r.Source, r.SnapshotID)), nil
		case err != nil:
			return nil, "", fmt.Errorf("read snapshot %s: %w", r.SnapshotID, err)
		case m.IncompleteReason != "":
			return nil, restoreRefusal(fmt.Sprintf("snapshot %s of %s is incomplete (%s): give the ID of a complete one, or choose by time", r.SnapshotID, m.Source.Path, m.IncompleteReason)), nil
		}
		m.ID = em.ID
		chosen = m
	}
	plan := make([]restoreStep, 0, len(r.Paths))
	left := maxCheckedEntries
	for _, p := range r.Paths {
		if strings.HasSuffix(p, placeholderSuffix) {
			// kopia restore reads such a source as a placeholder file of
			// the guest, not a path of the snapshot.
			return nil, restoreRefusal(fmt.Sprintf("%s ends in %s, which kopia restore takes for a placeholder file: restore the folder that holds it", p, placeholderSuffix)), nil
		}
		m := chosen
		switch {
		case m != nil && !userset.Holds(m.Source.Path, p):
			return nil, restoreRefusal(fmt.Sprintf("snapshot %s is of %s, which does not hold %s: restore %s from a snapshot of its own, in another request", r.SnapshotID, m.Source.Path, p, p)), nil
		case m == nil:
			root, manifests, why, err := holding(ctx, rep, r.Source, sources, p)
			if why != "" || err != nil {
				return nil, why, err
			}
			if m = latest(manifests, r.Before); m == nil {
				if r.Before == nil {
					return nil, restoreRefusal(fmt.Sprintf("%s has no complete snapshot of %s yet: take one, then ask again", r.Source, root)), nil
				}
				return nil, restoreRefusal(fmt.Sprintf("%s has no complete snapshot of %s started before %s: choose a later time, or the latest", r.Source, root, r.Before.UTC().Format(time.RFC3339))), nil
			}
		}
		step, why, err := stepOf(ctx, rep, m, p)
		if why != "" || err != nil {
			return nil, why, err
		}
		if r.Source != r.User {
			// Another VM wrote these snapshots, and kopia restore writes
			// each entry where its name leads: a name that climbs would
			// write outside the target. (Kopia reads one entry per name
			// of a folder, so no link and folder of one name reach it.)
			// A VM's own snapshots are its own root's doing, and are not
			// walked.
			if why, err := checkNames(ctx, rep, step.entry, p, &left); why != "" || err != nil {
				return nil, why, err
			}
		}
		plan = append(plan, step)
	}
	return plan, "", nil
}

// placeholderSuffix marks a shallow restore's placeholder, which kopia
// restore takes a source ending in for a file of the local filesystem.
const placeholderSuffix = ".kopia-entry"

// maxCheckedEntries bounds the entries checkNames reads for one request: a
// restore from another VM's snapshots is checked whole before it starts.
const maxCheckedEntries = 100_000

// maxPathBytes is the longest path a Linux file system holds: no entry of
// a snapshot kopia wrote lies deeper.
const maxPathBytes = 4096

// maxFolderListing bounds one folder's listing the server pod reads of a
// snapshot: kopia decodes a listing whole, and a guest may forge one of
// any size.
const maxFolderListing = 64 << 20

// readable refuses folder e of snapshot m, at path at, when its listing is
// larger than maxFolderListing; other entries pass.
func readable(ctx context.Context, rep repo.Repository, e fs.Entry, at string) (restoreRefusal, error) {
	d, ok := e.(snapshot.HasDirEntry)
	if !ok || d.DirEntry() == nil || d.DirEntry().Type != snapshot.EntryTypeDirectory {
		return "", nil
	}
	r, err := rep.OpenObject(ctx, d.DirEntry().ObjectID)
	if err != nil {
		return restoreRefusal(fmt.Sprintf("the snapshot's folder %s cannot be read (%v)", at, err)), nil
	}
	defer r.Close() //nolint:errcheck // read-only
	if n := r.Length(); n > maxFolderListing {
		return restoreRefusal(fmt.Sprintf("the snapshot's folder %s has a listing of %d bytes, more than the %d a restore from the cluster reads: restore it from inside the guest", at, n, maxFolderListing)), nil
	}
	return "", nil
}

// checkNames walks e, at path p of the snapshot, and refuses a name that is
// not one plain name (empty, ".", "..", or holding "/" or NUL), a path
// longer than maxPathBytes, a folder listing too large to read, or more
// entries than *left allows, which it counts down. It keeps a path's
// folders, not their names: a path is spelled only in a refusal.
func checkNames(ctx context.Context, rep repo.Repository, e fs.Entry, p string, left *int) (restoreRefusal, error) {
	type folder struct {
		dir    fs.Directory
		parent *folder
		name   string
		length int
	}
	spell := func(f *folder) string {
		var names []string
		for ; f.parent != nil; f = f.parent {
			names = append(names, f.name)
		}
		slices.Reverse(names)
		return path.Join(append([]string{p}, names...)...)
	}
	dir, ok := e.(fs.Directory)
	if !ok {
		return "", nil
	}
	stack := []*folder{{dir: dir, length: len(p)}}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if why, err := readable(ctx, rep, f.dir, spell(f)); why != "" || err != nil {
			return why, err
		}
		var why restoreRefusal
		err := fs.IterateEntries(ctx, f.dir, func(ctx context.Context, child fs.Entry) error {
			name := child.Name()
			switch *left--; {
			case *left < 0:
				why = restoreRefusal(fmt.Sprintf("%s holds more than %d entries, which a restore from another VM's snapshots checks one by one before it starts: restore fewer or smaller folders", p, maxCheckedEntries))
			case name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00"):
				why = restoreRefusal(fmt.Sprintf("the snapshot holds, in %s, an entry named %q, which is no file name: it was not written by kopia, and is not restored", spell(f), name))
			case f.length+1+len(name) > maxPathBytes:
				why = restoreRefusal(fmt.Sprintf("the snapshot holds, in %s, a path longer than %d bytes, which no file system holds: it was not written by kopia, and is not restored", spell(f), maxPathBytes))
			}
			if why != "" {
				return errStop
			}
			if d, ok := child.(fs.Directory); ok {
				stack = append(stack, &folder{dir: d, parent: f, name: name, length: f.length + 1 + len(name)})
			}
			return nil
		})
		switch {
		case why != "":
			return why, nil
		case err != nil:
			return restoreRefusal(fmt.Sprintf("the snapshot's folder %s cannot be read (%v)", spell(f), err)), nil
		}
	}
	return "", nil
}

// errStop ends a walk early.
var errStop = errors.New("stop")

// restoreStep is what restoring one path writes: the snapshot it comes
// from, with the size of what it holds at the path, and that entry.
type restoreStep struct {
	activity.Snapshot
	entry fs.Entry
}

// snapshots are the plan's snapshots, as a result records them.
func snapshots(plan []restoreStep) []activity.Snapshot {
	out := make([]activity.Snapshot, len(plan))
	for i, step := range plan {
		out[i] = step.Snapshot
	}
	return out
}

// stepOf is what restoring path p from snapshot m writes.
func stepOf(ctx context.Context, rep repo.Repository, m *snapshot.Manifest, p string) (restoreStep, restoreRefusal, error) {
	root, err := snapshotfs.SnapshotRoot(rep, m)
	if err != nil {
		return restoreStep{}, "", fmt.Errorf("open snapshot %s: %w", m.ID, err)
	}
	step := restoreStep{Snapshot: activity.Snapshot{ID: string(m.ID), Path: p, Root: m.Source.Path, Start: m.StartTime.ToTime().UTC(), End: m.EndTime.ToTime().UTC()}}
	var e fs.Entry = root
	walked := m.Source.Path
	// Each step descends into a directory of the snapshot, never through
	// a symbolic link: a snapshot's link cannot lead a restore elsewhere.
	for _, name := range strings.Split(strings.TrimPrefix(p, m.Source.Path), "/") {
		if name == "" {
			continue
		}
		dir, ok := e.(fs.Directory)
		if !ok {
			return restoreStep{}, restoreRefusal(fmt.Sprintf("snapshot %s of %s holds no %s: %s is not a folder in it", m.ID, m.Source.Path, p, walked)), nil
		}
		if why, err := readable(ctx, rep, e, walked); why != "" || err != nil {
			return restoreStep{}, why, err
		}
		walked = path.Join(walked, name)
		child, err := dir.Child(ctx, name)
		switch {
		case errors.Is(err, fs.ErrEntryNotFound):
			return restoreStep{}, restoreRefusal(fmt.Sprintf("snapshot %s of %s holds no %s", m.ID, m.Source.Path, p)), nil
		case err != nil:
			// A folder of the snapshot that does not decode is the
			// snapshot's fault, not the moment's: the request fails.
			return restoreStep{}, restoreRefusal(fmt.Sprintf("snapshot %s cannot be read at %s (%v)", m.ID, p, err)), nil
		}
		e = child
	}
	if why, err := readable(ctx, rep, e, p); why != "" || err != nil {
		return restoreStep{}, why, err
	}
	switch e := e.(type) {
	case fs.DirectoryWithSummary:
		sum, err := e.Summary(ctx)
		switch {
		case err != nil:
			return restoreStep{}, restoreRefusal(fmt.Sprintf("snapshot %s cannot be read at %s (%v)", m.ID, p, err)), nil
		case sum != nil:
			// A folder kopia wrote carries its summary; one a guest
			// forged may not, and is then counted as nothing.
			step.Files, step.Bytes = int32(min(max(sum.TotalFileCount, 0), int64(^uint32(0)>>1))), max(sum.TotalFileSize, 0)
		}
	case fs.File:
		step.Files, step.Bytes = 1, e.Size()
	}
	step.entry = e
	return step, "", nil
}

// sourceOf is the longest source path of sources that holds p; "" for
// none.
func sourceOf(sources map[string][]manifest.ID, p string) string {
	best := ""
	for root := range sources {
		if userset.Holds(root, p) && len(root) > len(best) {
			best = root
		}
	}
	return best
}

// latest is the newest complete snapshot of manifests started before
// before (nil: the newest of all); nil for none.
func latest(manifests []*snapshot.Manifest, before *time.Time) *snapshot.Manifest {
	if newest := newestFirst(manifests, before); len(newest) > 0 {
		return newest[0]
	}
	return nil
}

// newestFirst is the complete snapshots of manifests started before
// before (nil: all), newest first by start time, then ID.
func newestFirst(manifests []*snapshot.Manifest, before *time.Time) []*snapshot.Manifest {
	var out []*snapshot.Manifest
	for _, m := range manifests {
		if m.IncompleteReason != "" || before != nil && !m.StartTime.ToTime().Before(*before) {
			continue
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *snapshot.Manifest) int {
		return cmp.Or(b.StartTime.ToTime().Compare(a.StartTime.ToTime()), strings.Compare(string(b.ID), string(a.ID)))
	})
	return out
}

// sourcesOf is the snapshots of Kopia user source, by snapshot source
// path.
func sourcesOf(ctx context.Context, rep repo.Repository, source string) (map[string][]manifest.ID, error) {
	user, host, _ := strings.Cut(source, "@")
	entries, err := rep.FindManifests(ctx, map[string]string{
		manifest.TypeLabelKey:  snapshot.ManifestType,
		snapshot.UsernameLabel: user,
		snapshot.HostnameLabel: host,
	})
	if err != nil {
		return nil, fmt.Errorf("find the snapshots of %s: %w", source, err)
	}
	sources := map[string][]manifest.ID{}
	for _, e := range entries {
		p := e.Labels[snapshot.PathLabel]
		sources[p] = append(sources[p], e.ID)
	}
	return sources, nil
}

// holding is the snapshot source of source's sources that holds path p
// (sourceOf) and its snapshots, or a refusal when none holds it.
func holding(ctx context.Context, rep repo.Repository, source string, sources map[string][]manifest.ID, p string) (string, []*snapshot.Manifest, restoreRefusal, error) {
	root := sourceOf(sources, p)
	if root == "" {
		return "", nil, restoreRefusal(fmt.Sprintf("%s has no snapshot of %s or of a folder holding it (its snapshots are of %s)", source, p, listed(sources))), nil
	}
	manifests, err := snapshot.LoadSnapshots(ctx, rep, sources[root])
	if err != nil {
		return "", nil, "", fmt.Errorf("read the snapshots of %s:%s: %w", source, root, err)
	}
	return root, manifests, "", nil
}

// pathHistory lists the versions of history request r's one path: one per
// complete snapshot of r.Source's snapshot source that holds it (started
// before r.Before when set), newest first, at most
// v1alpha1.MaxHistoryVersions. A version changed when its content (its
// Kopia object) is not the next older one's. A snapshot whose path cannot
// be read is left out, as one that does not hold it: nothing is written.
func pathHistory(ctx context.Context, rep repo.Repository, r userset.Request) ([]activity.Version, restoreRefusal, error) {
	p := r.Paths[0]
	sources, err := sourcesOf(ctx, rep, r.Source)
	if err != nil {
		return nil, "", err
	}
	root, manifests, why, err := holding(ctx, rep, r.Source, sources, p)
	if why != "" || err != nil {
		return nil, why, err
	}
	var (
		versions []activity.Version
		objects  []object.ID
	)
	for _, m := range newestFirst(manifests, r.Before) {
		if len(versions) == v1alpha1.MaxHistoryVersions {
			break
		}
		step, why, err := stepOf(ctx, rep, m, p)
		switch {
		case err != nil:
			return nil, "", err
		case why != "":
			continue
		}
		typ, size := describe(ctx, step.entry)
		versions = append(versions, activity.Version{ID: step.ID, Start: step.Start, Type: typ, Size: size, ModTime: step.entry.ModTime().UTC()})
		var id object.ID
		if d, ok := step.entry.(snapshot.HasDirEntry); ok && d.DirEntry() != nil {
			id = d.DirEntry().ObjectID
		}
		objects = append(objects, id)
	}
	if len(versions) == 0 {
		return nil, restoreRefusal(fmt.Sprintf("no complete snapshot of %s by %s holds %s", root, r.Source, p)), nil
	}
	for i := range versions {
		versions[i].Changed = i == len(versions)-1 || objects[i] != objects[i+1]
	}
	return versions, "", nil
}

// describe is what entry e is (file, directory or symlink) and its size
// (a folder's files', as its summary says; 0 without one).
func describe(ctx context.Context, e fs.Entry) (string, int64) {
	switch {
	case e.IsDir():
		if d, ok := e.(fs.DirectoryWithSummary); ok {
			if sum, err := d.Summary(ctx); err == nil && sum != nil {
				return "directory", sum.TotalFileSize
			}
		}
		return "directory", 0
	case e.Mode()&os.ModeSymlink != 0:
		return "symlink", 0
	}
	return "file", e.Size()
}

// listed names the source paths of sources for a message: none, or the
// first few in order.
func listed(sources map[string][]manifest.ID) string {
	roots := make([]string, 0, len(sources))
	for root := range sources {
		roots = append(roots, root)
	}
	slices.Sort(roots)
	switch {
	case len(roots) == 0:
		return "nothing yet"
	case len(roots) > 8:
		return strings.Join(roots[:8], ", ") + fmt.Sprintf(" and %d more", len(roots)-8)
	}
	return strings.Join(roots, ", ")
}

// dryRunListing is what restoring plan, into target (or in place), would write:
// its entries in path order, at most userset.MaxListingEntries and
// MaxListingBytes of them, and the count and size of all its files. It
// reads folders of the snapshots only as far as the entries it lists.
func dryRunListing(ctx context.Context, rep repo.Repository, plan []restoreStep, target string, inPlace bool) (*activity.Listing, restoreRefusal, error) {
	l := &activity.Listing{}
	size := 0
	add := func(at string, e fs.Entry) bool {
		encoded, _ := json.Marshal(at) // a string: cannot fail
		if len(l.Entries) >= userset.MaxListingEntries || size+len(encoded) > userset.MaxListingBytes {
			l.Truncated = true
			return false
		}
		entry := activity.Entry{Path: at, ModTime: e.ModTime().UTC()}
		entry.Type, entry.Size = describe(ctx, e)
		size += len(encoded)
		l.Entries = append(l.Entries, entry)
		return true
	}
	var walk func(at string, e fs.Entry) error
	walk = func(at string, e fs.Entry) error {
		if !add(at, e) {
			return nil
		}
		dir, ok := e.(fs.Directory)
		if !ok {
			return nil
		}
		switch why, err := readable(ctx, rep, e, at); {
		case err != nil:
			return err
		case why != "":
			return refusalError(why)
		}
		// Kopia iterates a folder in no particular order.
		children, err := fs.GetAllEntries(ctx, dir)
		if err != nil {
			return refusalError(fmt.Sprintf("the snapshot's folder %s cannot be read (%v)", at, err))
		}
		slices.SortFunc(children, func(a, b fs.Entry) int { return strings.Compare(a.Name(), b.Name()) })
		for _, child := range children {
			if l.Truncated {
				return nil
			}
			if err := walk(path.Join(at, child.Name()), child); err != nil {
				return err
			}
		}
		return nil
	}
	for _, step := range plan {
		l.Files += int64(step.Files)
		l.Bytes += step.Bytes
		at := step.Path
		if !inPlace {
			at = path.Join(target, step.Path)
		}
		var why refusalError
		switch err := walk(at, step.entry); {
		case errors.As(err, &why):
			return nil, restoreRefusal(why), nil
		case err != nil:
			return nil, "", fmt.Errorf("list %s in snapshot %s: %w", step.Path, step.ID, err)
		}
	}
	return l, "", nil
}

// refusalError carries a restoreRefusal through a walk's error.
type refusalError string

func (e refusalError) Error() string { return string(e) }
