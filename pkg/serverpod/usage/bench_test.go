package usage_test

import (
	"context"
	"fmt"
	"testing"

	kopiafs "github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
	"github.com/kopia/kopia/snapshot/upload"

	"github.com/guestbackup/guestbackup/pkg/serverpod/usage"
)

// BenchmarkMeasure measures one Measure of a repository of 50 guests
// with 3 snapshots each (150 snapshots), each snapshot a tree of 5
// directories and 22 files of 4 KiB: 10 files the same in every guest (an
// operating system's), 10 of the guest's own unchanged across its
// snapshots, 2 fresh ones. The repository is opened without a content
// cache, so every directory is read from the (filesystem) storage at each
// measurement. Writing the snapshots is not timed.
func BenchmarkMeasure(b *testing.B) {
	const guests, perGuest, files = 50, 3, 10
	ctx := context.Background()
	_, r, _ := newBed(b)
	common := make([][]byte, files)
	for i := range common {
		common[i] = random(4 << 10)
	}
	for g := range guests {
		own := make([][]byte, files)
		for i := range own {
			own[i] = random(4 << 10)
		}
		source := snapshot.SourceInfo{UserName: fmt.Sprintf("vm-%03d", g), Host: "team-a", Path: "/data"}
		err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "bench snapshots"}, func(ctx context.Context, w repo.RepositoryWriter) error {
			tree, err := policy.TreeForSource(ctx, w, source)
			if err != nil {
				return err
			}
			for range perGuest {
				var osFiles, ownFiles []kopiafs.Entry
				for i := range files {
					osFiles = append(osFiles, file(fmt.Sprint("os-", i), common[i]))
					ownFiles = append(ownFiles, file(fmt.Sprint("own-", i), own[i]))
				}
				root := dir("data",
					file("fresh-1", random(4<<10)), file("fresh-2", random(4<<10)),
					dir("usr", dir("lib", osFiles...)),
					dir("home", dir("docs", ownFiles...)))
				man, err := upload.NewUploader(w).Upload(ctx, root, tree, source)
				if err != nil {
					return err
				}
				if _, err := snapshot.SaveSnapshot(ctx, w, man); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := r.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	var got map[string]int64
	for b.Loop() {
		var err error
		if got, err = usage.Measure(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var total int64
	for _, n := range got {
		total += n
	}
	if len(got) != guests || total == 0 {
		b.Fatalf("measured %d users, %d bytes in all; want %d users", len(got), total, guests)
	}
	b.ReportMetric(float64(guests*perGuest), "snapshots")
	b.ReportMetric(float64(total)/guests, "bytes/user")
}
