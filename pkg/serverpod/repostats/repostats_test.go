package repostats_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	kopiafs "github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/fs/virtualfs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
	"github.com/kopia/kopia/snapshot/upload"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/repostats"
)

// snapshotOf writes one snapshot of size fresh random bytes for source.
func snapshotOf(t *testing.T, r repo.Repository, source snapshot.SourceInfo, size int) {
	t.Helper()
	ctx := context.Background()
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "test snapshot"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		tree, err := policy.TreeForSource(ctx, w, source)
		if err != nil {
			return err
		}
		data := make([]byte, size)
		_, _ = rand.Read(data)
		root := virtualfs.NewStaticDirectory("data", []kopiafs.Entry{
			virtualfs.StreamingFileFromReader("file", io.NopCloser(bytes.NewReader(data))),
		})
		man, err := upload.NewUploader(w).Upload(ctx, root, tree, source)
		if err != nil {
			return err
		}
		_, err = snapshot.SaveSnapshot(ctx, w, man)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMeasureAgreesWithTheStorage: a real filesystem repository that
// guests' snapshots filled is measured as its folder holds it, and each
// source's snapshots are counted.
func TestMeasureAgreesWithTheStorage(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "repository")
	config := filepath.Join(t.TempDir(), "repository.config")
	const password = "pw"
	if _, err := serverpod.ConnectOrCreate(ctx, serverpod.Storage{Filesystem: &serverpod.FilesystemLocation{Path: dir}}, config, password, nil); err != nil {
		t.Fatal(err)
	}
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx) //nolint:errcheck // a test's repository

	const size = 256 << 10
	web := snapshot.SourceInfo{UserName: "web", Host: "team-a", Path: "/etc"}
	for range 3 {
		snapshotOf(t, r, web, size)
	}
	snapshotOf(t, r, snapshot.SourceInfo{UserName: "web", Host: "team-a", Path: "/home"}, size)
	snapshotOf(t, r, snapshot.SourceInfo{UserName: "db", Host: "team-b", Path: "/var/lib/db"}, size)
	if err := r.Refresh(ctx); err != nil {
		t.Fatal(err)
	}

	stats, err := repostats.Measure(ctx, r.(repo.DirectRepository))
	if err != nil {
		t.Fatal(err)
	}
	var files, bytesOnDisk int64
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, ".shards") {
			return err
		}
		info, err := d.Info()
		files++
		bytesOnDisk += info.Size()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measured %+v; folder: %d files, %d bytes", stats, files, bytesOnDisk)
	if stats.Blobs != files || stats.StoredBytes != bytesOnDisk {
		t.Errorf("measured %d blobs of %d bytes, the folder holds %d files of %d bytes", stats.Blobs, stats.StoredBytes, files, bytesOnDisk)
	}
	// Five snapshots of fresh random data: at least that much logical
	// data (plus directories), and random data does not compress.
	if stats.LogicalBytes < 5*size || stats.StoredBytes < 5*size {
		t.Errorf("logical %d and stored %d bytes, want each at least the %d bytes written", stats.LogicalBytes, stats.StoredBytes, 5*size)
	}

	counts, err := repostats.CountSnapshots(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	want := map[repostats.Source]int{
		{User: "web@team-a", Path: "/etc"}:       3,
		{User: "web@team-a", Path: "/home"}:      1,
		{User: "db@team-b", Path: "/var/lib/db"}: 1,
	}
	if len(counts) != len(want) {
		t.Fatalf("counts %v, want %v", counts, want)
	}
	for s, n := range want {
		if counts[s] != n {
			t.Errorf("source %v: %d snapshots, want %d", s, counts[s], n)
		}
	}

	c := &repostats.Collector{}
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Fatalf("an unset Collector serves %d metrics, want none (no figure is better than a false 0)", n)
	}
	c.SetStats(stats)
	c.SetSources(counts)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if n := testutil.CollectAndCount(c, "guestbackup_server_source_snapshots"); n != 3 {
		t.Errorf("%d source series, want 3", n)
	}
	if got := testutil.ToFloat64(onlyStored{c}); got != float64(stats.StoredBytes) {
		t.Errorf("stored bytes served %v, want %d", got, stats.StoredBytes)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("the pedantic registry refuses the Collector: %v", err)
	}
}

// onlyStored is the Collector's stored-bytes gauge alone, for ToFloat64.
type onlyStored struct{ c *repostats.Collector }

func (o onlyStored) Describe(ch chan<- *prometheus.Desc) { o.c.Describe(ch) }

func (o onlyStored) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 64)
	go func() { o.c.Collect(all); close(all) }()
	for m := range all {
		if strings.Contains(m.Desc().String(), `"guestbackup_server_repository_stored_bytes"`) {
			ch <- m
		}
	}
}
