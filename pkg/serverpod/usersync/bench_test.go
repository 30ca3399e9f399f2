package usersync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usersync"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// BenchmarkProvisioningLatency measures, for 20 users one after another, the
// time from writing a user's Secret to the first successful authentication
// of a real kopia client (the client's own run time included), and reports
// the 50th and 95th percentiles. Target: p95 <= 3 s.
func BenchmarkProvisioningLatency(b *testing.B) {
	const users = 20
	ctx := context.Background()
	api := testbed.StartAPIServer(b, testbed.APIServerOptions{})
	clientset := kubernetes.NewForConfigOrDie(api.Config)
	if _, err := clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	srv := testbed.StartKopiaServer(b, testbed.KopiaServerOptions{})
	r, err := repo.Open(ctx, srv.ConfigFile, srv.RepoPassword, &repo.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(ctx)
	s := usersync.New(usersync.Options{
		Client: clientset, Namespace: namespace, BSLS: bsls, Repository: r, Server: controlOf(b, srv), Log: logr.Discard(),
	})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = s.Run(runCtx) }()

	shards := make([]map[string]identity.Hash, userset.Shards)
	for i := range shards {
		shards[i] = map[string]identity.Hash{}
		putShard(b, clientset, bsls, i, shards[i])
	}
	if err := testbed.WaitFor(time.Minute, 50*time.Millisecond, func() (bool, error) { return s.Ready() == nil, s.Ready() }); err != nil {
		b.Fatal(err)
	}

	var latencies []time.Duration
	n := 0
	for b.Loop() {
		for range users {
			b.StopTimer()
			user := fmt.Sprintf("vm-%03d@bench", n)
			n++
			password := testbed.RandomPassword()
			h, err := identity.NewHash(password, identity.Scrypt) // hashed once, by the controller
			if err != nil {
				b.Fatal(err)
			}
			shard := userset.ShardOf(user)
			shards[shard][user] = h
			b.StartTimer()

			start := time.Now()
			putShard(b, clientset, bsls, shard, shards[shard])
			err = testbed.WaitFor(30*time.Second, 50*time.Millisecond, func() (bool, error) {
				_, err := testbed.NewKopiaClient(b).Connect(ctx, srv.URL, srv.CA.CertPEM(), user, password)
				return err == nil, err
			})
			if err != nil {
				b.Fatalf("user %s never authenticated: %v", user, err)
			}
			latencies = append(latencies, time.Since(start))
		}
	}
	b.ReportMetric(testbed.Percentile(latencies, 50).Seconds(), "p50-s")
	b.ReportMetric(testbed.Percentile(latencies, 95).Seconds(), "p95-s")
	b.ReportMetric(float64(len(latencies)), "users")
}

// putShard writes shard Secret shard of BSLS name, listing users.
func putShard(tb testbed.TB, c kubernetes.Interface, name string, shard int, users map[string]identity.Hash) {
	tb.Helper()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: userset.SecretName(name, shard), Namespace: namespace,
			Labels: map[string]string{userset.Label: name},
		},
		Data: map[string][]byte{userset.Key: userset.Encode(users)},
	}
	ctx := context.Background()
	_, err := c.CoreV1().Secrets(namespace).Update(ctx, secret, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		_, err = c.CoreV1().Secrets(namespace).Create(ctx, secret, metav1.CreateOptions{})
	}
	if err != nil {
		tb.Fatalf("write users Secret %s: %v", secret.Name, err)
	}
}
