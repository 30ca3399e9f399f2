package scale

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/fs/virtualfs"
	"github.com/kopia/kopia/repo"
	s3blob "github.com/kopia/kopia/repo/blob/s3"
	"github.com/kopia/kopia/snapshot"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// idleWindow is how long BenchmarkReplicasAgree counts an idle replica's
// storage requests.
const idleWindow = 30 * time.Second

// BenchmarkReplicasAgree measures what docs/design.md, decision 26, asks of a
// BSLS's replicas: two Kopia servers on one repository in a MinIO bucket,
// refreshing every kopiaserver.ReplicaRefreshInterval as the server pods of
// a BSLS with several replicas do. Each op is a guest's snapshot written
// through one server and then polled for through the other; it reports
// how long the snapshot stayed unseen there (seen-ms: the worst op; the
// goal is 5,000), what the refresh costs an idle replica in storage
// requests per minute (requests/min, by method in the log), and how long
// one refresh takes (refresh-ms), during which Kopia's server holds the
// lock that new sessions wait for.
//
// Each write session of a client adds an index blob, and Kopia merges
// them only when its epoch advances, at least a day later: every refresh
// lists the day's. So the figures are taken on a new repository and on one
// that holds the index blobs of half a day of hourly snapshots of 100
// guests (1,200 write sessions; writing them takes a few minutes, and more
// than linearly longer for more).
func BenchmarkReplicasAgree(b *testing.B) {
	for _, sessions := range []int{0, 1200} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) { replicasAgree(b, sessions) })
	}
}

// replicasAgree is BenchmarkReplicasAgree on a repository that sessions
// write sessions wrote to first.
func replicasAgree(b *testing.B, sessions int) {
	testbed.RequireTestBed(b)
	minio := testbed.StartMinIO(b)
	if err := minio.CreateBucket("replicas"); err != nil {
		b.Fatal(err)
	}
	s3 := &testbed.KopiaS3{MinIO: minio, Bucket: "replicas"}
	first := testbed.StartKopiaServer(b, testbed.KopiaServerOptions{S3: s3, RefreshInterval: kopiaserver.ReplicaRefreshInterval})
	second := testbed.StartKopiaServer(b, testbed.KopiaServerOptions{S3: s3, RepoPassword: first.RepoPassword, CA: first.CA, RefreshInterval: kopiaserver.ReplicaRefreshInterval})
	const user = "web@team-a"
	password := testbed.RandomPassword()
	h, err := identity.NewHash(password, identity.Scrypt)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := first.SetUsers(ctx, map[string]identity.Hash{user: h}); err != nil {
		b.Fatal(err)
	}
	if sessions > 0 {
		writeSessions(ctx, b, s3, first.RepoPassword, sessions)
	}
	indexes, err := minio.Objects("replicas", "x")
	if err != nil {
		b.Fatal(err)
	}
	// The first refresh reads what it has not read yet; the next ones
	// are what every refresh costs.
	if err := second.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	refreshStart := time.Now()
	if err := second.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	refresh := time.Since(refreshStart)
	writer, reader := testbed.NewKopiaClient(b), testbed.NewKopiaClient(b)
	for _, c := range []struct {
		k   *testbed.KopiaClient
		url string
	}{{writer, first.URL}, {reader, second.URL}} {
		if out, err := c.k.Connect(ctx, c.url, first.CA.CertPEM(), user, password); err != nil {
			b.Fatalf("connect to %s: %v: %s", c.url, err, out)
		}
	}

	before, err := storageRequests(ctx, second)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(idleWindow)
	after, err := storageRequests(ctx, second)
	if err != nil {
		b.Fatal(err)
	}

	source := b.TempDir()
	var worst time.Duration
	round := 0
	b.ResetTimer()
	for b.Loop() {
		round++
		if err := os.WriteFile(filepath.Join(source, "data.txt"), []byte("round "+strconv.Itoa(round)), 0o600); err != nil {
			b.Fatal(err)
		}
		if out, err := writer.Run(ctx, "snapshot", "create", source); err != nil {
			b.Fatalf("snapshot: %v: %s", err, out)
		}
		written := time.Now()
		ids, err := writer.SnapshotIDs(ctx, source)
		if err != nil {
			b.Fatal(err)
		}
		for {
			seen, err := reader.SnapshotIDs(ctx, source)
			if err != nil {
				b.Fatal(err)
			}
			if slices.Equal(seen, ids) {
				break
			}
			if time.Since(written) > time.Minute {
				b.Fatalf("snapshot %s unseen through the other server after a minute", ids[len(ids)-1])
			}
			time.Sleep(100 * time.Millisecond)
		}
		worst = max(worst, time.Since(written))
	}
	b.StopTimer()
	total, methods := 0, []string{}
	for method, n := range after {
		d := n - before[method]
		total += d
		if d > 0 {
			methods = append(methods, fmt.Sprintf("%s %.0f/min", method, float64(d)/idleWindow.Minutes()))
		}
	}
	slices.Sort(methods)
	b.ReportMetric(float64(worst.Milliseconds()), "seen-ms")
	b.ReportMetric(float64(total)/idleWindow.Minutes(), "requests/min")
	b.ReportMetric(float64(refresh.Milliseconds()), "refresh-ms")
	b.ReportMetric(float64(len(indexes)), "index-blobs")
	b.Logf("an idle replica refreshing every %s: %s", kopiaserver.ReplicaRefreshInterval, strings.Join(methods, ", "))
}

// writeSessions writes n write sessions into s3's repository, each saving
// one small snapshot of a guest, as n guests' `kopia snapshot create`
// would: each session flushes its own index blob.
func writeSessions(ctx context.Context, b *testing.B, s3 *testbed.KopiaS3, password string, n int) {
	b.Helper()
	st, err := s3blob.New(ctx, &s3blob.Options{
		BucketName: s3.Bucket, Endpoint: s3.MinIO.Endpoint, DoNotUseTLS: true, Region: testbed.MinIORegion,
		AccessKeyID: s3.MinIO.AccessKeyID, SecretAccessKey: s3.MinIO.SecretAccessKey,
	}, false)
	if err != nil {
		b.Fatalf("open the bucket: %v", err)
	}
	config := filepath.Join(b.TempDir(), "repository.config")
	if err := repo.Connect(ctx, config, st, password, &repo.ConnectOptions{}); err != nil {
		b.Fatalf("connect to the repository: %v", err)
	}
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	if err != nil {
		b.Fatalf("open the repository: %v", err)
	}
	defer func() { _ = r.Close(ctx) }()
	for i := range n {
		source := snapshot.SourceInfo{UserName: fmt.Sprintf("vm-%03d", i%100), Host: "team-a", Path: "/data"}
		err := testbed.SaveSnapshots(ctx, r, source, 1, func(int) fs.Entry {
			return virtualfs.NewStaticDirectory("data", []fs.Entry{
				virtualfs.StreamingFileFromReader("state", io.NopCloser(strings.NewReader(fmt.Sprintf("session %d", i)))),
			})
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// storageRequests reads a Kopia server's count of storage operations, by
// method, from its /metrics (Kopia's blob storage latency histograms).
func storageRequests(ctx context.Context, s *testbed.KopiaServer) (map[string]int, error) {
	pool := x509.NewCertPool()
	pool.AddCert(s.CA.Cert)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}, Timeout: 30 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", s.URL, err)
	}
	defer resp.Body.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.HasPrefix(name, "kopia_blob_storage_latency") || !strings.HasSuffix(name, "_count") {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		_, method, _ := strings.Cut(labels, `method="`)
		method, _, _ = strings.Cut(method, `"`)
		n, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %q: %w", s.URL, line, err)
		}
		counts[method] += int(n)
	}
	if len(counts) == 0 {
		return nil, fmt.Errorf("metrics of %s: no kopia_blob_storage_latency_*_count", s.URL)
	}
	return counts, sc.Err()
}
