package activityscan_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/snapshot"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/serverpod/activityscan"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// countingTransport counts the requests a client sends to the API server.
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// BenchmarkPollCycle is one activity poll of a server with 1,000 guests of
// 10 snapshots each, as its user-sync container runs it: scan the
// repository, publish to a real API server. It reports the API requests
// of a cycle: none when nothing is new, two per shard whose guests took a
// snapshot.
func BenchmarkPollCycle(b *testing.B) {
	ctx := context.Background()
	api := testbed.StartAPIServer(b, testbed.APIServerOptions{})
	var requests atomic.Int64
	cfg := rest.CopyConfig(api.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &requests} })
	configMaps := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps("backup")
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "backup"}}); err != nil {
		b.Fatal(err)
	}
	for shard := range userset.Shards {
		if err := api.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: activity.ConfigMapName("main", shard), Namespace: "backup"}}); err != nil {
			b.Fatal(err)
		}
	}
	srv := testbed.StartKopiaServer(b, testbed.KopiaServerOptions{})
	r, err := repo.Open(ctx, srv.ConfigFile, srv.RepoPassword, &repo.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Close(ctx) })
	write := func(guests, each int, at time.Time) {
		b.Helper()
		err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
			for g := range guests {
				for i := range each {
					if _, err := snapshot.SaveSnapshot(ctx, w, &snapshot.Manifest{
						Source:  snapshot.SourceInfo{Host: "ns", UserName: fmt.Sprintf("vm-%04d", g), Path: "/etc"},
						EndTime: fs.UTCTimestamp(at.Add(time.Duration(i) * time.Second).UnixNano()),
					}); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	write(1000, 10, time.Now())
	s := activityscan.New()
	cycle := func() {
		if err := r.Refresh(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Scan(ctx, r); err != nil {
			b.Fatal(err)
		}
		if err := s.Publish(ctx, configMaps, "main", nil); err != nil {
			b.Fatal(err)
		}
	}
	cycle()

	b.Run("nothing-new", func(b *testing.B) {
		requests.Store(0)
		n := 0
		for b.Loop() {
			cycle()
			n++
		}
		b.ReportMetric(float64(requests.Load())/float64(n), "api-requests/op")
	})
	b.Run("one-guest-new", func(b *testing.B) {
		requests.Store(0)
		n := 0
		for b.Loop() {
			b.StopTimer()
			write(1, 1, time.Now())
			b.StartTimer()
			cycle()
			n++
		}
		b.ReportMetric(float64(requests.Load())/float64(n), "api-requests/op")
	})
}
