// Package activityscan finds what a Kopia server's guests did, in the
// server pod: it scans the repository's snapshot manifests incrementally
// and publishes, per guest, how many snapshots it has and its latest one
// into the activity ConfigMaps, and its newest ones into the catalogue
// ConfigMaps (package activity is their format).
package activityscan

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// Scanner keeps the activity of a repository's guests, reading only what
// is new at each scan: the snapshot manifests' metadata (labels and
// write time, held in memory by Kopia) every time, the payload of one new
// manifest per guest at most.
type Scanner struct {
	seen   map[manifest.ID]bool
	guests map[string]activity.Guest
	// written is each shard's own activity, as Publish last wrote it into
	// its ConfigMap (merged there with what other replicas heard); stale
	// marks the shards to read and write again all the same (Republish).
	written [userset.Shards][]byte
	stale   [userset.Shards]bool

	// catalogues are the guests' catalogues, made from the manifests top
	// names, each user's newest by write time.
	catalogues map[string]catalogue
	top        map[string][]manifest.ID
	// cataloguesWritten is each catalogue shard as PublishCatalogues last
	// wrote (or found) it; nil before.
	cataloguesWritten [activity.CatalogueShards][]byte
}

// New returns a Scanner that has seen nothing.
func New() *Scanner {
	return &Scanner{
		seen: map[manifest.ID]bool{}, guests: map[string]activity.Guest{},
		catalogues: map[string]catalogue{}, top: map[string][]manifest.ID{},
	}
}

// Seen is how many snapshot manifests the Scanner has read the metadata of
// since New, deleted ones included.
func (s *Scanner) Seen() int { return len(s.seen) }

// Shards returns the activity of every guest, by userset shard.
func (s *Scanner) Shards() [userset.Shards]map[string]activity.Guest {
	var shards [userset.Shards]map[string]activity.Guest
	for i := range shards {
		shards[i] = map[string]activity.Guest{}
	}
	for user, g := range s.guests {
		shards[userset.ShardOf(user)][user] = g
	}
	return shards
}

// Scan reads what changed since the last scan and reports whether any
// guest's activity did.
func (s *Scanner) Scan(ctx context.Context, r repo.Repository) (bool, error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: snapshot.ManifestType})
	if err != nil {
		return false, fmt.Errorf("list snapshots: %w", err)
	}
	counts := map[string]int{}
	newest := map[string]*manifest.EntryMetadata{}
	first := map[string]time.Time{}
	top := map[string][]*manifest.EntryMetadata{}
	for _, e := range entries {
		user := e.Labels[snapshot.UsernameLabel] + "@" + e.Labels[snapshot.HostnameLabel]
		counts[user]++
		top[user] = keepNewest(top[user], e)
		if s.seen[e.ID] {
			continue
		}
		s.seen[e.ID] = true
		if n := newest[user]; n == nil || e.ModTime.After(n.ModTime) {
			newest[user] = e
		}
		if f, ok := first[user]; !ok || e.ModTime.Before(f) {
			first[user] = e.ModTime
		}
	}
	changed := false
	for user, count := range counts {
		g, had := s.guests[user]
		g.User = user
		if g.Snapshots != count {
			g.Snapshots, changed = count, true
		}
		if f, ok := first[user]; ok && (g.First.IsZero() || f.Before(g.First)) {
			g.First, changed = f.UTC(), true
		}
		if e := newest[user]; e != nil {
			snap, err := readSnapshot(ctx, r, user, e.ID)
			if err != nil {
				return changed, err
			}
			if !had || snap.End.After(g.Last.End) {
				g.Last, changed = snap, true
			}
		}
		s.guests[user] = g
	}
	for user, g := range s.guests {
		if counts[user] == 0 && g.Snapshots != 0 {
			g.Snapshots, changed = 0, true // every snapshot deleted; the last one stays on record
			s.guests[user] = g
		}
	}
	catalogued, err := s.catalogue(ctx, r, top)
	return changed || catalogued, err
}

// catalogue is one guest's catalogue: its snapshots as read, with their
// times whole, which order them even within a second, and as published
// (activity.Newest).
type catalogue struct {
	read, published []activity.Snapshot
}

// keepNewest adds e to newest, the newest manifests of one user by write
// time (then ID), newest first, and keeps v1alpha1.MaxRecentSnapshots.
func keepNewest(newest []*manifest.EntryMetadata, e *manifest.EntryMetadata) []*manifest.EntryMetadata {
	newer := func(a, b *manifest.EntryMetadata) bool {
		return a.ModTime.After(b.ModTime) || a.ModTime.Equal(b.ModTime) && a.ID > b.ID
	}
	if len(newest) == v1alpha1.MaxRecentSnapshots && !newer(e, newest[len(newest)-1]) {
		return newest
	}
	i := len(newest)
	for i > 0 && newer(e, newest[i-1]) {
		i--
	}
	newest = slices.Insert(newest, i, e)
	return newest[:min(len(newest), v1alpha1.MaxRecentSnapshots)]
}

// catalogue makes each guest's catalogue again from its newest manifests,
// top, when they are not those it was made from: a snapshot was taken, or
// one of them deleted. Only a manifest new to a catalogue is read.
func (s *Scanner) catalogue(ctx context.Context, r repo.Repository, top map[string][]*manifest.EntryMetadata) (bool, error) {
	changed := false
	for user := range s.catalogues {
		if top[user] == nil {
			delete(s.catalogues, user)
			delete(s.top, user)
			changed = true
		}
	}
	for user, entries := range top {
		ids := make([]manifest.ID, len(entries))
		for i, e := range entries {
			ids[i] = e.ID
		}
		if slices.Equal(ids, s.top[user]) {
			continue
		}
		known := map[string]activity.Snapshot{}
		for _, snap := range s.catalogues[user].read {
			known[snap.ID] = snap
		}
		snaps := make([]activity.Snapshot, 0, len(entries))
		for _, e := range entries {
			snap, ok := known[string(e.ID)]
			if !ok {
				m, err := readManifest(ctx, r, user, e.ID)
				if err != nil {
					return changed, err
				}
				if m.IncompleteReason != "" {
					// A checkpoint, or a snapshot its guest cancelled:
					// nothing to restore from.
					continue
				}
				snap = snapshotOf(e.ID, m)
			}
			snaps = append(snaps, snap)
		}
		s.catalogues[user], s.top[user] = catalogue{read: snaps, published: activity.Newest(user, snaps)}, ids
		changed = true
	}
	return changed, nil
}

// readSnapshot reads manifest id of user as an activity.Snapshot.
func readSnapshot(ctx context.Context, r repo.Repository, user string, id manifest.ID) (activity.Snapshot, error) {
	m, err := readManifest(ctx, r, user, id)
	if err != nil {
		return activity.Snapshot{}, err
	}
	return snapshotOf(id, m), nil
}

// readManifest reads snapshot manifest id of user.
func readManifest(ctx context.Context, r repo.Repository, user string, id manifest.ID) (*snapshot.Manifest, error) {
	var m snapshot.Manifest
	if _, err := r.GetManifest(ctx, id, &m); err != nil {
		return nil, fmt.Errorf("read snapshot %s of %s: %w", id, user, err)
	}
	return &m, nil
}

// snapshotOf is manifest m, of ID id, as an activity.Snapshot.
func snapshotOf(id manifest.ID, m *snapshot.Manifest) activity.Snapshot {
	files, bytes := contents(m)
	return activity.Snapshot{
		ID: string(id), Path: m.Source.Path,
		Start: m.StartTime.ToTime().UTC(), End: m.EndTime.ToTime().UTC(),
		Bytes: bytes, Files: files,
	}
}

// contents is how many files a snapshot holds, and their size. Its root's
// summary says, as `kopia snapshot list` does: the upload's counter of
// files leaves out those unchanged since the previous snapshot, so a
// second snapshot of the same files counted none. Without a summary
// (a manifest that has none), the upload's counters are summed.
func contents(m *snapshot.Manifest) (files int32, bytes int64) {
	if m.RootEntry != nil && m.RootEntry.DirSummary != nil {
		s := m.RootEntry.DirSummary
		return int32(min(max(s.TotalFileCount, 0), math.MaxInt32)), max(s.TotalFileSize, 0)
	}
	return int32(min(int64(m.Stats.TotalFileCount)+int64(m.Stats.CachedFiles), math.MaxInt32)), m.Stats.TotalFileSize
}

// PublishCatalogues writes the catalogue ConfigMaps of bsls whose content
// is not what the last call wrote; they must exist (the controller
// creates them). Every replica of the server makes the same catalogues
// from the same repository, so each writes its own over what it finds:
// one that has not yet seen a snapshot writes a catalogue without it, and
// its next scan, which sees it, writes it in.
func (s *Scanner) PublishCatalogues(ctx context.Context, configMaps corev1client.ConfigMapInterface, bsls string) error {
	var shards [activity.CatalogueShards]map[string][]activity.Snapshot
	for i := range shards {
		shards[i] = map[string][]activity.Snapshot{}
	}
	for user, c := range s.catalogues {
		if len(c.published) > 0 {
			shards[activity.CatalogueShardOf(user)][user] = c.published
		}
	}
	var errs []error
	for shard, catalogues := range shards {
		data := activity.FitCatalogues(catalogues)
		if s.cataloguesWritten[shard] != nil && bytes.Equal(data, s.cataloguesWritten[shard]) {
			continue
		}
		name := activity.CatalogueConfigMapName(bsls, shard)
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cm, err := configMaps.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("catalogue ConfigMap %s: %w", name, err)
			}
			if cm.Data[activity.CatalogueKey] == string(data) {
				return nil
			}
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			cm.Data[activity.CatalogueKey] = string(data)
			if _, err := configMaps.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update catalogue ConfigMap %s: %w", name, err)
			}
			return nil
		})
		if err != nil {
			// The other shards are written all the same.
			errs = append(errs, err)
			continue
		}
		s.cataloguesWritten[shard] = append([]byte{}, data...)
	}
	return errors.Join(errs...)
}

// Report records a guest's report in its activity; it is published with
// the next Publish (a guest that never snapshotted gets an entry too).
func (s *Scanner) Report(user string, r activity.Report) {
	g := s.guests[user]
	g.User = user
	g.Report = &r
	s.guests[user] = g
}

// Publish writes the activity ConfigMaps of bsls whose own content
// changed since the last Publish, or that Republish marked; they must
// exist (the controller creates them). A cycle with nothing new costs no
// API request. What the ConfigMap holds already is merged in
// (activity.Merge): another replica of the server may have written
// results and reports of guests it heard. keep drops the results of
// requests no longer asked; nil keeps all.
func (s *Scanner) Publish(ctx context.Context, configMaps corev1client.ConfigMapInterface, bsls string, keep func(user string, r activity.Result) bool) error {
	for shard, guests := range s.Shards() {
		data := activity.Encode(guests)
		if !s.stale[shard] && bytes.Equal(data, s.written[shard]) {
			continue
		}
		name := activity.ConfigMapName(bsls, shard)
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			return updateActivity(ctx, configMaps, name, func(published map[string]activity.Guest) map[string]activity.Guest {
				return activity.Merge(published, guests, keep)
			})
		})
		if err != nil {
			return err
		}
		s.written[shard], s.stale[shard] = data, false
	}
	return nil
}

// Republish makes the next Publish read and write every shard, whether or
// not its own content changed: the requests asked changed, and results
// of those no longer asked go.
func (s *Scanner) Republish() {
	for i := range s.stale {
		s.stale[i] = true
	}
}

// RecordResult writes res, a guest's result to one of its requests, into
// user's activity in the ConfigMap of its shard, where the controller and
// every replica of the server read it, unless that ConfigMap holds an
// ending of the request already: the first ending recorded stands
// (activity.Supersede). It returns the result that stands.
func RecordResult(ctx context.Context, configMaps corev1client.ConfigMapInterface, bsls, user string, res activity.Result) (activity.Result, error) {
	name := activity.ConfigMapName(bsls, userset.ShardOf(user))
	stands := res
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		return updateActivity(ctx, configMaps, name, func(published map[string]activity.Guest) map[string]activity.Guest {
			g := published[user]
			g.User = user
			g.Results = activity.MergeResults(g.Results, []activity.Result{res})
			stands = g.Results[slices.IndexFunc(g.Results, func(r activity.Result) bool { return r.UID == res.UID })]
			published[user] = g
			return published
		})
	})
	return stands, err
}

// PublishedResult reads user's result to request uid from the activity
// ConfigMap of its shard; nil when there is none.
func PublishedResult(ctx context.Context, configMaps corev1client.ConfigMapInterface, bsls, user, uid string) (*activity.Result, error) {
	name := activity.ConfigMapName(bsls, userset.ShardOf(user))
	cm, err := configMaps.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("activity ConfigMap %s: %w", name, err)
	}
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		return nil, fmt.Errorf("activity ConfigMap %s: %w", name, err)
	}
	for _, r := range guests[user].Results {
		if r.UID == uid {
			return &r, nil
		}
	}
	return nil, nil //nolint:nilnil // no result yet
}

// updateActivity reads ConfigMap name, and writes what change makes of its
// guests when that differs. A malformed activity is written over: only
// server pods write it, and what it held cannot be read anyway.
func updateActivity(ctx context.Context, configMaps corev1client.ConfigMapInterface, name string, change func(map[string]activity.Guest) map[string]activity.Guest) error {
	cm, err := configMaps.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("activity ConfigMap %s: %w", name, err)
	}
	published, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		published = map[string]activity.Guest{}
	}
	data := string(activity.Encode(change(published)))
	if cm.Data[activity.Key] == data {
		return nil
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[activity.Key] = data
	if _, err := configMaps.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update activity ConfigMap %s: %w", name, err)
	}
	return nil
}

// RequestSnapshots returns the snapshots of user that carry request uid's
// tag (userset.RequestTag), oldest first. The labels are the repository's
// (user and host are those the Kopia server authenticated), so a guest
// cannot claim another's snapshot for its request, nor a snapshot it did
// not take.
func RequestSnapshots(ctx context.Context, r repo.Repository, user, uid string) ([]activity.Snapshot, error) {
	name, host, ok := strings.Cut(user, "@")
	if !ok {
		return nil, fmt.Errorf("%q is not user@host", user)
	}
	entries, err := r.FindManifests(ctx, map[string]string{
		manifest.TypeLabelKey:       snapshot.ManifestType,
		snapshot.UsernameLabel:      name,
		snapshot.HostnameLabel:      host,
		"tag:" + userset.RequestTag: uid,
	})
	if err != nil {
		return nil, fmt.Errorf("find the snapshots of request %s: %w", uid, err)
	}
	out := make([]activity.Snapshot, 0, len(entries))
	for _, e := range entries {
		snap, err := readSnapshot(ctx, r, user, e.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, snap)
	}
	slices.SortFunc(out, func(a, b activity.Snapshot) int { return cmp.Or(a.Start.Compare(b.Start), strings.Compare(a.ID, b.ID)) })
	return out, nil
}
