package mutate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// BenchmarkAdmissionHTTPS is the webhook as the API server uses it: HTTPS
// AdmissionReviews on loopback, from as many concurrent clients as cores,
// for the steady state of an opted-in VM (re-admission: nothing changes),
// reading the BSLS, the namespace and the VM's Secret from the webhook's
// cache of a real API server on the same machine. Reports admissions per
// second, in all and per core. Target: >= 2,000 per core.
func BenchmarkAdmissionHTTPS(b *testing.B) {
	ctx := context.Background()
	api := testbed.StartAPIServer(b, testbed.APIServerOptions{})
	for _, ns := range []string{"backup", "team-a"} {
		if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
	}
	bsls := readyServer().BSLS.DeepCopy()
	status := bsls.Status
	bsls.Spec.Storage.Filesystem = &v1alpha1.FilesystemStorage{}
	bsls.Spec.Access.NamespaceSelector = &metav1.LabelSelector{} // every namespace
	if err := api.Client.Create(ctx, bsls); err != nil {
		b.Fatal(err)
	}
	bsls.Status = status
	bsls.Status.Conditions[0].LastTransitionTime = metav1.Now()
	bsls.Status.Conditions[0].Message = "ready"
	if err := api.Client.Status().Update(ctx, bsls); err != nil {
		b.Fatal(err)
	}

	// The VM as stored after its first admission, and its Secret.
	original := readVM(b, "no-cloud-init")
	first, err := Decide(Input{Object: original, Namespace: "team-a", Server: Server{BSLS: bsls, NamespaceAllowed: true}, NewPassword: NewPassword})
	if err != nil || first.Denied != "" {
		b.Fatalf("%v %s", err, first.Denied)
	}
	if err := api.Client.Create(ctx, first.Secret); err != nil {
		b.Fatal(err)
	}
	review, err := testbed.VMUpdateReview("team-a", "web", apply(b, original, first), nil)
	if err != nil {
		b.Fatal(err)
	}

	opts := CacheOptions()
	opts.Scheme = api.Scheme
	informers, err := cache.New(api.Config, opts)
	if err != nil {
		b.Fatal(err)
	}
	cacheCtx, stopCache := context.WithCancel(ctx)
	b.Cleanup(stopCache)
	go func() { _ = informers.Start(cacheCtx) }()
	if !informers.WaitForCacheSync(ctx) {
		b.Fatal("the cache did not sync")
	}
	url, roots := startWebhookServer(b, NewHandler(informers, api.Client, api.Client, nil))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 64,
	}}
	// b.Loop keeps the API server across iterations (RunParallel would
	// run this whole function, setup included, again for every b.N); each
	// iteration is a batch of admissions from concurrent clients.
	const batch = 64
	clients := 2 * runtime.GOMAXPROCS(0)
	admit := func() error { return testbed.AdmitUnchanged(client, url, review) }
	var total int
	var elapsed time.Duration
	for b.Loop() {
		start := time.Now()
		work := make(chan struct{}, batch)
		for range batch {
			work <- struct{}{}
		}
		close(work)
		var g errgroup.Group
		for range clients {
			g.Go(func() error {
				for range work {
					if err := admit(); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		total += batch
	}
	perSecond := float64(total) / elapsed.Seconds()
	b.ReportMetric(perSecond, "admissions/s")
	b.ReportMetric(perSecond/float64(runtime.GOMAXPROCS(0)), "admissions/s/core")
}

// startWebhookServer serves h at Path on a free loopback port with a
// certificate of a fresh CA, until the benchmark ends.
func startWebhookServer(b *testing.B, h admission.Handler) (string, *x509.CertPool) {
	b.Helper()
	dir := b.TempDir()
	ca, err := testbed.WriteLoopbackServingCert(dir)
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	port, err := testbed.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	server := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir})
	server.Register(Path, &admission.Webhook{Handler: h})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.Start(ctx) }()
	b.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			b.Error("the webhook server did not stop within 30s")
		}
	})
	if err := testbed.WaitFor(30*time.Second, 50*time.Millisecond, func() (bool, error) {
		err := server.StartedChecker()(nil)
		return err == nil, err
	}); err != nil {
		b.Fatal(err)
	}
	return "https://127.0.0.1:" + strconv.Itoa(port) + Path, roots
}
