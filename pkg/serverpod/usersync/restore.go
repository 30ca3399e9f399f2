package usersync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/snapshotfs"

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
func restorePlan(ctx context.Context, rep repo.Repository, r userset.Request) ([]activity.Snapshot, restoreRefusal, error) {
	user, host, _ := strings.Cut(r.Source, "@")
	entries, err := rep.FindManifests(ctx, map[string]string{
		manifest.TypeLabelKey:  snapshot.ManifestType,
		snapshot.UsernameLabel: user,
		snapshot.HostnameLabel: host,
	})
	if err != nil {
		return nil, "", fmt.Errorf("find the snapshots of %s: %w", r.Source, err)
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
		}
		m.ID = em.ID
		chosen = m
	}
	sources := map[string][]manifest.ID{}
	for _, e := range entries {
		p := e.Labels[snapshot.PathLabel]
		sources[p] = append(sources[p], e.ID)
	}
	plan := make([]activity.Snapshot, 0, len(r.Paths))
	for _, p := range r.Paths {
		m := chosen
		switch {
		case m != nil && !holds(m.Source.Path, p):
			return nil, restoreRefusal(fmt.Sprintf("snapshot %s is of %s, which does not hold %s: restore %s from a snapshot of its own, in another request", r.SnapshotID, m.Source.Path, p, p)), nil
		case m == nil:
			root := sourceOf(sources, p)
			if root == "" {
				return nil, restoreRefusal(fmt.Sprintf("%s has no snapshot of %s or of a folder holding it (its snapshots are of %s)", r.Source, p, listed(sources))), nil
			}
			manifests, err := snapshot.LoadSnapshots(ctx, rep, sources[root])
			if err != nil {
				return nil, "", fmt.Errorf("read the snapshots of %s:%s: %w", r.Source, root, err)
			}
			if m = latest(manifests, r.Before); m == nil {
				if r.Before == nil {
					return nil, restoreRefusal(fmt.Sprintf("%s has no complete snapshot of %s yet: take one, then ask again", r.Source, root)), nil
				}
				return nil, restoreRefusal(fmt.Sprintf("%s has no complete snapshot of %s started before %s: choose a later time, or the latest", r.Source, root, r.Before.UTC().Format(time.RFC3339))), nil
			}
		}
		step, why, err := restoreStep(ctx, rep, m, p)
		if why != "" || err != nil {
			return nil, why, err
		}
		plan = append(plan, step)
	}
	return plan, "", nil
}

// restoreStep is what restoring path p from snapshot m writes: the
// snapshot, and the size of what it holds at p.
func restoreStep(ctx context.Context, rep repo.Repository, m *snapshot.Manifest, p string) (activity.Snapshot, restoreRefusal, error) {
	root, err := snapshotfs.SnapshotRoot(rep, m)
	if err != nil {
		return activity.Snapshot{}, "", fmt.Errorf("open snapshot %s: %w", m.ID, err)
	}
	step := activity.Snapshot{ID: string(m.ID), Path: p, Root: m.Source.Path, Start: m.StartTime.ToTime().UTC(), End: m.EndTime.ToTime().UTC()}
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
			return activity.Snapshot{}, restoreRefusal(fmt.Sprintf("snapshot %s of %s holds no %s: %s is not a folder in it", m.ID, m.Source.Path, p, walked)), nil
		}
		walked = path.Join(walked, name)
		child, err := dir.Child(ctx, name)
		switch {
		case errors.Is(err, fs.ErrEntryNotFound):
			return activity.Snapshot{}, restoreRefusal(fmt.Sprintf("snapshot %s of %s holds no %s", m.ID, m.Source.Path, p)), nil
		case err != nil:
			return activity.Snapshot{}, "", fmt.Errorf("read snapshot %s at %s: %w", m.ID, p, err)
		}
		e = child
	}
	switch e := e.(type) {
	case fs.DirectoryWithSummary:
		sum, err := e.Summary(ctx)
		if err != nil {
			return activity.Snapshot{}, "", fmt.Errorf("read the summary of %s in snapshot %s: %w", p, m.ID, err)
		}
		step.Files, step.Bytes = int32(min(sum.TotalFileCount, int64(^uint32(0)>>1))), sum.TotalFileSize
	case fs.File:
		step.Files, step.Bytes = 1, e.Size()
	}
	return step, "", nil
}

// holds reports whether snapshot source path root holds path p.
func holds(root, p string) bool {
	return root == p || root == "/" || strings.HasPrefix(p, root+"/")
}

// sourceOf is the longest source path of sources that holds p; "" for
// none.
func sourceOf(sources map[string][]manifest.ID, p string) string {
	best := ""
	for root := range sources {
		if holds(root, p) && len(root) > len(best) {
			best = root
		}
	}
	return best
}

// latest is the newest complete snapshot of manifests started before
// before (nil: the newest of all); nil for none.
func latest(manifests []*snapshot.Manifest, before *time.Time) *snapshot.Manifest {
	var best *snapshot.Manifest
	for _, m := range manifests {
		if m.IncompleteReason != "" || before != nil && !m.StartTime.ToTime().Before(*before) {
			continue
		}
		if best == nil || cmp.Or(m.StartTime.ToTime().Compare(best.StartTime.ToTime()), strings.Compare(string(m.ID), string(best.ID))) > 0 {
			best = m
		}
	}
	return best
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
