package activityscan

import (
	"context"
	"testing"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/snapshot"

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
