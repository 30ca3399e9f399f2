package activityscan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// snap writes snapshot manifests as a guest's kopia does, through the
// server: labelled with the guest's user, host and path.
func snap(tb testing.TB, r repo.Repository, user, host, path string, end time.Time, bytes int64) {
	tb.Helper()
	err := repo.WriteSession(context.Background(), r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
		_, err := snapshot.SaveSnapshot(ctx, w, &snapshot.Manifest{
			Source:    snapshot.SourceInfo{Host: host, UserName: user, Path: path},
			StartTime: fs.UTCTimestamp(end.Add(-time.Second).UnixNano()),
			EndTime:   fs.UTCTimestamp(end.UnixNano()),
			Stats:     snapshot.Stats{TotalFileSize: bytes, TotalFileCount: 3},
		})
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
}

func TestScannerReadsOnlyWhatIsNew(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewRepository(t)
	s := New()
	if changed, err := s.Scan(ctx, r); err != nil || changed {
		t.Fatalf("empty repository: changed %v, %v", changed, err)
	}
	t0 := time.Date(2026, 11, 23, 2, 0, 0, 0, time.UTC)
	snap(t, r, "web", "team-a", "/etc", t0, 100)
	snap(t, r, "web", "team-a", "/etc", t0.Add(time.Hour), 150)
	snap(t, r, "db", "team-b", "/var/lib/db", t0, 999)
	if changed, err := s.Scan(ctx, r); err != nil || !changed {
		t.Fatalf("three snapshots: changed %v, %v", changed, err)
	}
	web := s.Shards()[userset.ShardOf("web@team-a")]["web@team-a"]
	if web.Snapshots != 2 || web.Last.Bytes != 150 || web.Last.Path != "/etc" || !web.Last.End.Equal(t0.Add(time.Hour)) || web.Last.Files != 3 {
		t.Errorf("web@team-a: %+v", web)
	}
	if changed, err := s.Scan(ctx, r); err != nil || changed {
		t.Errorf("nothing new: changed %v, %v", changed, err)
	}
	snap(t, r, "web", "team-a", "/home", t0.Add(2*time.Hour), 7)
	if changed, err := s.Scan(ctx, r); err != nil || !changed {
		t.Fatalf("a new snapshot: changed %v, %v", changed, err)
	}
	web = s.Shards()[userset.ShardOf("web@team-a")]["web@team-a"]
	if web.Snapshots != 3 || web.Last.Path != "/home" || web.Last.Bytes != 7 {
		t.Errorf("web@team-a after a new snapshot: %+v", web)
	}
}

// TestScannerCatalogues: a guest's catalogue is its newest snapshots,
// newest first; a deleted one leaves it, and the next older one, read
// then, takes its place; a guest with none left has none.
func TestScannerCatalogues(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewRepository(t)
	s := New()
	t0 := time.Date(2026, 11, 23, 2, 0, 0, 0, time.UTC)
	for i := range v1alpha1.MaxRecentSnapshots + 2 {
		snap(t, r, "web", "team-a", fmt.Sprintf("/srv/%02d", i), t0.Add(time.Duration(i)*time.Hour), int64(i))
	}
	snap(t, r, "db", "team-b", "/var/lib/db", t0, 999)
	if _, err := s.Scan(ctx, r); err != nil {
		t.Fatal(err)
	}
	paths := func(user string) []string {
		var out []string
		for _, snap := range s.catalogues[user].published {
			out = append(out, snap.Path)
		}
		return out
	}
	want := []string{"/srv/11", "/srv/10", "/srv/09", "/srv/08", "/srv/07", "/srv/06", "/srv/05", "/srv/04", "/srv/03", "/srv/02"}
	if got := paths("web@team-a"); !slices.Equal(got, want) {
		t.Errorf("web's catalogue %v, want %v", got, want)
	}
	if got := paths("db@team-b"); !slices.Equal(got, []string{"/var/lib/db"}) {
		t.Errorf("db's catalogue %v", got)
	}

	newest := s.catalogues["web@team-a"].published[0].ID
	dbs := s.catalogues["db@team-b"].published[0].ID
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
		return errors.Join(w.DeleteManifest(ctx, manifest.ID(newest)), w.DeleteManifest(ctx, manifest.ID(dbs)))
	})
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := s.Scan(ctx, r); err != nil || !changed {
		t.Fatalf("after deletions: changed %v, %v", changed, err)
	}
	want = append(want[1:], "/srv/01")
	if got := paths("web@team-a"); !slices.Equal(got, want) {
		t.Errorf("web's catalogue after its newest snapshot went %v, want %v", got, want)
	}
	if _, held := s.catalogues["db@team-b"]; held {
		t.Errorf("db has no snapshot left, but a catalogue: %v", paths("db@team-b"))
	}
	if changed, err := s.Scan(ctx, r); err != nil || changed {
		t.Errorf("nothing new: changed %v, %v", changed, err)
	}
}

// TestContents: a snapshot's files are its root's summary's, as `kopia
// snapshot list` shows them, not the upload's counter, which leaves out
// the files unchanged since the previous snapshot.
func TestContents(t *testing.T) {
	tests := []struct {
		name  string
		m     snapshot.Manifest
		files int32
		bytes int64
	}{
		{name: "a second snapshot of unchanged files", m: snapshot.Manifest{
			Stats:     snapshot.Stats{TotalFileSize: 6000, CachedFiles: 1},
			RootEntry: &snapshot.DirEntry{DirSummary: &fs.DirectorySummary{TotalFileCount: 1, TotalFileSize: 6000}},
		}, files: 1, bytes: 6000},
		{name: "no summary: the upload's counters, cached files too", m: snapshot.Manifest{
			Stats: snapshot.Stats{TotalFileSize: 10, TotalFileCount: 2, CachedFiles: 3},
		}, files: 5, bytes: 10},
		{name: "more files than an int32 holds", m: snapshot.Manifest{
			RootEntry: &snapshot.DirEntry{DirSummary: &fs.DirectorySummary{TotalFileCount: 1 << 40, TotalFileSize: 1 << 50}},
		}, files: 1<<31 - 1, bytes: 1 << 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if files, bytes := contents(&tt.m); files != tt.files || bytes != tt.bytes {
				t.Errorf("%d files, %d bytes; want %d, %d", files, bytes, tt.files, tt.bytes)
			}
		})
	}
}

// A checkpoint, or a snapshot its guest cancelled, is nothing to restore
// from: the catalogue leaves it out.
func TestScannerCataloguesLeaveIncompleteOut(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewRepository(t)
	t0 := time.Date(2026, 11, 23, 2, 0, 0, 0, time.UTC)
	snap(t, r, "web", "team-a", "/etc", t0, 100)
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
		_, err := snapshot.SaveSnapshot(ctx, w, &snapshot.Manifest{
			Source:           snapshot.SourceInfo{Host: "team-a", UserName: "web", Path: "/etc"},
			StartTime:        fs.UTCTimestamp(t0.Add(time.Hour).UnixNano()),
			EndTime:          fs.UTCTimestamp(t0.Add(time.Hour + time.Second).UnixNano()),
			IncompleteReason: "canceled",
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s := New()
	if _, err := s.Scan(ctx, r); err != nil {
		t.Fatal(err)
	}
	if got := s.catalogues["web@team-a"].published; len(got) != 1 || got[0].Bytes != 100 {
		t.Errorf("web's catalogue %+v, want its complete snapshot only", got)
	}
}
