package serverpod_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/fs/virtualfs"
	"github.com/kopia/kopia/repo"
	kopiamaintenance "github.com/kopia/kopia/repo/maintenance"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
	"github.com/kopia/kopia/snapshot/upload"

	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
	"github.com/guestbackup/guestbackup/pkg/serverpod/repostats"
)

// BenchmarkMaintenance: 100 users take 10 snapshots each of 64 KiB of
// fresh data, retention then keeps each user's latest, and guestbackup's
// full maintenance collects the rest. It reports the maintenance run's
// wall time and the stored bytes before and after it (the whole iteration,
// writing the snapshots included, is ns/op; it runs once), and what the
// server pod's repository metrics cost on it (repostats).
func BenchmarkMaintenance(b *testing.B) {
	const users, perUser, size = 100, 10, 64 << 10
	for range b.N {
		ctx := context.Background()
		dir := filepath.Join(b.TempDir(), "repository")
		storage := serverpod.Storage{Filesystem: &serverpod.FilesystemLocation{Path: dir}}
		config := filepath.Join(b.TempDir(), "repository.config")
		const password = "pw"
		if _, err := serverpod.ConnectOrCreate(ctx, storage, config, password, nil); err != nil {
			b.Fatal(err)
		}
		if _, _, err := serverpod.ClaimMaintenance(ctx, storage, config, password,
			serverpod.MaintenanceOptions{Namespace: "ns", BSLS: "store"}); err != nil {
			b.Fatal(err)
		}
		r, err := repo.Open(ctx, config, password, &repo.Options{})
		if err != nil {
			b.Fatal(err)
		}
		// Each snapshot in its own session, as a guest's upload is: its
		// data lands in packs of its own.
		for u := range users {
			source := snapshot.SourceInfo{Host: "ns", UserName: fmt.Sprintf("vm-%03d", u), Path: "/data"}
			var taken []manifest.ID
			for range perUser {
				err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "bench snapshot"}, func(ctx context.Context, w repo.RepositoryWriter) error {
					tree, err := policy.TreeForSource(ctx, w, source)
					if err != nil {
						return err
					}
					data := make([]byte, size)
					_, _ = rand.Read(data)
					root := virtualfs.NewStaticDirectory("data", []fs.Entry{
						virtualfs.StreamingFileFromReader("file", io.NopCloser(bytes.NewReader(data))),
					})
					man, err := upload.NewUploader(w).Upload(ctx, root, tree, source)
					if err != nil {
						return err
					}
					id, err := snapshot.SaveSnapshot(ctx, w, man)
					taken = append(taken, id)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			// Retention keeps the latest.
			err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "bench retention"}, func(ctx context.Context, w repo.RepositoryWriter) error {
				for _, id := range taken[:len(taken)-1] {
					if err := w.DeleteManifest(ctx, id); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		_ = r.Close(ctx)
		before := storedBytes(b, dir)

		mr, err := repo.Open(ctx, serverpod.MaintenanceConfigFile(config), password, &repo.Options{})
		if err != nil {
			b.Fatal(err)
		}
		// What the server pod's /metrics costs on this repository: one
		// measurement (every --repository-stats-interval) and one count
		// of snapshots per source (every activity scan).
		stats, err := repostats.Measure(ctx, mr.(repo.DirectRepository))
		if err != nil {
			b.Fatal(err)
		}
		countStart := time.Now()
		sources, err := repostats.CountSnapshots(ctx, mr)
		if err != nil {
			b.Fatal(err)
		}
		countTook := time.Since(countStart)
		if len(sources) != users {
			b.Fatalf("%d sources counted, want %d", len(sources), users)
		}
		// As in TestMaintenanceShrinksStorage: Kopia's margins without the waits.
		safety := kopiamaintenance.SafetyNone
		safety.RewriteMinAge = time.Hour
		runner := maintenance.NewRunner(maintenance.Options{Repository: mr.(repo.DirectRepository), Safety: &safety, Log: logr.Discard()})
		start := time.Now()
		if _, err := runner.RunOnce(ctx, kopiamaintenance.ModeFull); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		_ = mr.Close(ctx)
		after := storedBytes(b, dir)
		b.ReportMetric(took.Seconds(), "maintenance-s")
		b.ReportMetric(float64(before), "stored-bytes-before")
		b.ReportMetric(float64(after), "stored-bytes-after")
		b.ReportMetric(float64(stats.Blobs), "blobs-before")
		b.ReportMetric(stats.Took.Seconds(), "measure-s")
		b.ReportMetric(countTook.Seconds(), "count-sources-s")
	}
}
