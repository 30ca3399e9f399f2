package usage_test

import (
	"context"
	"fmt"
	"testing"

	kopiafs "github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/snapshot"

	"github.com/guestbackup/guestbackup/internal/testbed"
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
		err := testbed.SaveSnapshots(ctx, r, source, perGuest, func(int) kopiafs.Entry {
			var osFiles, ownFiles []kopiafs.Entry
			for i := range files {
				osFiles = append(osFiles, file(fmt.Sprint("os-", i), common[i]))
				ownFiles = append(ownFiles, file(fmt.Sprint("own-", i), own[i]))
			}
			return dir("data",
				file("fresh-1", random(4<<10)), file("fresh-2", random(4<<10)),
				dir("usr", dir("lib", osFiles...)),
				dir("home", dir("docs", ownFiles...)))
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
