// Package scale measures what limits guestbackup with many guests: logins
// per second against real Kopia servers sharing one repository on MinIO, as
// a BSLS's replicas do, and what the controller and the webhook cost, in
// memory and in time to settle, with many opted-in VMs in a real API
// server, and how long a request takes to reach its guest. Benchmarks
// only: `make test` runs none of it.
package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kopia/kopia/repo"
	// SetUsers opens the S3 repository in this process.
	_ "github.com/kopia/kopia/repo/blob/s3"
	"golang.org/x/sync/errgroup"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// StormEnv sets how many distinct guests BenchmarkLoginStorm connects at
// once; the default keeps `make bench` short, 1000 is the figure the sizing
// table quotes.
const StormEnv = "GUESTBACKUP_BENCH_STORM"

// replicaCounts are the server counts measured.
var replicaCounts = []int{1, 2, 4}

// servers are Kopia servers on one repository in a MinIO bucket, with the
// given users, all with one password (hashed once: a server verifies it at
// every login all the same).
type servers struct {
	list     []*testbed.KopiaServer
	password string
	hash     time.Duration // one scrypt hash, measured here
}

func startServers(b *testing.B, count int, users []string) *servers {
	b.Helper()
	minio := testbed.StartMinIO(b)
	if err := minio.CreateBucket("logins"); err != nil {
		b.Fatal(err)
	}
	s := &servers{password: testbed.RandomPassword()}
	first := testbed.StartKopiaServer(b, testbed.KopiaServerOptions{S3: &testbed.KopiaS3{MinIO: minio, Bucket: "logins"}})
	s.list = append(s.list, first)
	for range count - 1 {
		s.list = append(s.list, testbed.StartKopiaServer(b, testbed.KopiaServerOptions{
			S3: &testbed.KopiaS3{MinIO: minio, Bucket: "logins"}, RepoPassword: first.RepoPassword, CA: first.CA,
		}))
	}
	start := time.Now()
	h, err := identity.NewHash(s.password, identity.Scrypt)
	if err != nil {
		b.Fatal(err)
	}
	s.hash = time.Since(start)
	put := make(map[string]identity.Hash, len(users))
	for _, u := range users {
		put[u] = h
	}
	ctx := context.Background()
	if err := first.SetUsers(ctx, put); err != nil {
		b.Fatal(err)
	}
	for _, srv := range s.list[1:] {
		if err := srv.Refresh(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// connect writes a client configuration for user at server i: Kopia's
// public client API, one login.
func (s *servers) connect(ctx context.Context, dir string, i int, user string) (string, error) {
	config := filepath.Join(dir, fmt.Sprintf("%s-%d.config", user, i))
	name, host, _ := cutAt(user)
	err := repo.ConnectAPIServer(ctx, config, &repo.APIServerInfo{BaseURL: s.list[i].URL, TrustedServerCertificateFingerprint: s.list[i].CAPin},
		s.password, &repo.ConnectOptions{ClientOptions: repo.ClientOptions{Username: name, Hostname: host}})
	if err != nil {
		return "", fmt.Errorf("connect %s to server %d: %w", user, i, err)
	}
	return config, nil
}

func cutAt(user string) (string, string, bool) {
	for i := range len(user) {
		if user[i] == '@' {
			return user[:i], user[i+1:], true
		}
	}
	return user, "", false
}

// BenchmarkLogins opens API-server sessions (each one a login the server
// verifies under its one mutex) from many goroutines of one process, in
// bursts of 8 per server, spread over 1, 2 and 4 servers as a Service
// spreads guests over replicas.
// Reports logins/s; the ceiling of one server is 1 / the hash time
// (hash-ms, measured in the same run), and replicas share this machine's
// cores (cores).
func BenchmarkLogins(b *testing.B) {
	const usersPerServer = 4
	var users []string
	for i := range usersPerServer {
		users = append(users, "bench-"+strconv.Itoa(i)+"@scale")
	}
	s := startServers(b, replicaCounts[len(replicaCounts)-1], users)
	ctx := context.Background()
	for _, replicas := range replicaCounts {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			dir := b.TempDir()
			var configs []string
			for i := range replicas {
				for _, u := range users {
					config, err := s.connect(ctx, dir, i, u)
					if err != nil {
						b.Fatal(err)
					}
					configs = append(configs, config)
				}
			}
			// Each op is a burst of 8 logins per server, all at once, so
			// that the servers always have logins waiting.
			burst := 8 * replicas
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				var g errgroup.Group
				for j := range burst {
					g.Go(func() error {
						r, err := repo.Open(ctx, configs[j%len(configs)], s.password, &repo.Options{})
						if err != nil {
							return err
						}
						return r.Close(ctx)
					})
				}
				if err := g.Wait(); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			perSecond := float64(b.N*burst) / elapsed.Seconds()
			b.ReportMetric(perSecond, "logins/s")
			// How many hashes ran at once: 1 is one server's mutex.
			b.ReportMetric(perSecond*s.hash.Seconds(), "hashes-in-parallel")
			b.ReportMetric(float64(s.hash.Milliseconds()), "hash-ms")
			b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "cores")
		})
	}
}

// BenchmarkLoginStorm connects N distinct guests at once (N from
// GUESTBACKUP_BENCH_STORM, default 32; the sizing table uses 1000) to 4
// servers, each guest its own first session, and reports the time until all
// are in (storm-s) against its floor: N × one hash ÷ the cores the servers
// can use, min(cores, replicas) (floor-s), and their ratio.
func BenchmarkLoginStorm(b *testing.B) {
	n := 32
	if v := os.Getenv(StormEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("%s=%q: want a positive count", StormEnv, v)
		}
	}
	replicas := replicaCounts[len(replicaCounts)-1]
	users := make([]string, n)
	for i := range users {
		users[i] = "guest-" + strconv.Itoa(i) + "@storm"
	}
	s := startServers(b, replicas, users)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		dir := b.TempDir()
		start := time.Now()
		var g errgroup.Group
		var mu sync.Mutex
		var failed int
		for j, u := range users {
			g.Go(func() error {
				if _, err := s.connect(ctx, dir, j%replicas, u); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					return err
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatalf("storm %d: %d of %d guests failed, e.g. %v", i, failed, n, err)
		}
		storm := time.Since(start)
		usable := min(runtime.GOMAXPROCS(0), replicas)
		floor := time.Duration(n) * s.hash / time.Duration(usable)
		b.ReportMetric(storm.Seconds(), "storm-s")
		b.ReportMetric(floor.Seconds(), "floor-s")
		b.ReportMetric(storm.Seconds()/floor.Seconds(), "x-floor")
		b.ReportMetric(float64(n), "guests")
	}
	b.ReportMetric(s.peakRSS(b)/(1<<20), "server-peak-MiB")
}

// peakRSS is the highest peak resident memory of the servers, in bytes.
func (s *servers) peakRSS(b *testing.B) float64 {
	var peak int64
	for _, srv := range s.list {
		rss, err := srv.Process.PeakRSS()
		if err != nil {
			b.Fatal(err)
		}
		peak = max(peak, rss)
	}
	return float64(peak)
}
