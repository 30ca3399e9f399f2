package integrity_test

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
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/snapshot"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod/integrity"
)

// BenchmarkVerificationPass prints, in `make bench`, the cost of one
// verification pass over 10,000 snapshots (100 guests, 100 snapshots each
// of a directory of one fresh 4 KiB file and two unchanged ones). It
// reports the first pass of a pod (which walks every snapshot), a later
// pass of an intact repository (which does not), and the pass that finds a
// lost pack (which walks them again and writes the rehash notices), with
// the bytes read back. Writing the snapshots is not timed.
func BenchmarkVerificationPass(b *testing.B) {
	const guests, perGuest = 100, 100
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		dir := filepath.Join(b.TempDir(), "repository")
		st, err := filesystem.New(ctx, &filesystem.Options{Path: dir}, true)
		if err != nil {
			b.Fatal(err)
		}
		const password = "bench password"
		if err := repo.Initialize(ctx, st, &repo.NewRepositoryOptions{}, password); err != nil {
			b.Fatal(err)
		}
		config := filepath.Join(b.TempDir(), "owner.config")
		if err := repo.Connect(ctx, config, st, password, &repo.ConnectOptions{ClientOptions: repo.ClientOptions{Username: "guestbackup-maintenance", Hostname: "main.backup"}}); err != nil {
			b.Fatal(err)
		}
		r, err := repo.Open(ctx, config, password, &repo.Options{})
		if err != nil {
			b.Fatal(err)
		}
		unchanged := [2][]byte{make([]byte, 4<<10), make([]byte, 4<<10)}
		_, _ = rand.Read(unchanged[0])
		_, _ = rand.Read(unchanged[1])
		for g := range guests {
			source := snapshot.SourceInfo{Host: "team-a", UserName: fmt.Sprintf("vm-%03d", g), Path: "/data"}
			err := testbed.SaveSnapshots(ctx, r, source, perGuest, func(int) fs.Entry {
				fresh := make([]byte, 4<<10)
				_, _ = rand.Read(fresh)
				return virtualfs.NewStaticDirectory("data", []fs.Entry{
					virtualfs.StreamingFileFromReader("fresh", io.NopCloser(bytes.NewReader(fresh))),
					virtualfs.StreamingFileFromReader("kept-1", io.NopCloser(bytes.NewReader(unchanged[0]))),
					virtualfs.StreamingFileFromReader("kept-2", io.NopCloser(bytes.NewReader(unchanged[1]))),
				})
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		owner := r.(repo.DirectRepository)
		uncached, err := integrity.OpenUncached(ctx, config, password)
		if err != nil {
			b.Fatal(err)
		}
		v := integrity.NewVerifier(integrity.Options{Repository: owner, Reader: uncached, ReadBytesPerPass: -1, Log: logr.Discard()})

		b.StartTimer()
		start := time.Now()
		first, err := v.Pass(ctx)
		if err != nil {
			b.Fatal(err)
		}
		firstTook := time.Since(start)
		start = time.Now()
		if _, err := v.Pass(ctx); err != nil {
			b.Fatal(err)
		}
		laterTook := time.Since(start)
		b.StopTimer()
		// A data pack goes: it holds one snapshot's fresh file.
		packs, err := blob.ListAllBlobs(ctx, st, content.PackBlobIDPrefixRegular)
		if err != nil || len(packs) == 0 {
			b.Fatalf("data packs: %v", err)
		}
		if err := st.DeleteBlob(ctx, packs[len(packs)/2].BlobID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start = time.Now()
		found, err := v.Pass(ctx)
		if err != nil {
			b.Fatal(err)
		}
		lossTook := time.Since(start)
		b.StopTimer()
		if first.DamagedSnapshots != 0 || found.LostContents == 0 || found.DamagedSnapshots == 0 {
			b.Fatalf("first pass %+v; after the loss %+v", first, found)
		}
		b.ReportMetric(float64(first.Contents), "contents")
		b.ReportMetric(float64(first.Packs), "packs")
		b.ReportMetric(firstTook.Seconds(), "first-pass-s")
		b.ReportMetric(laterTook.Seconds(), "pass-s")
		b.ReportMetric(lossTook.Seconds(), "pass-after-loss-s")
		b.ReportMetric(float64(first.ReadBytes), "read-bytes")
		_ = uncached.Close(ctx)
		_ = r.Close(ctx)
	}
}
