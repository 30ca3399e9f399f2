package scale

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
	"github.com/guestbackup/guestbackup/test/story"
)

// requestsMeasured is how many GuestSnapshots BenchmarkRequestStart makes.
const requestsMeasured = 12

// requestTimeout bounds each request's way to its guest and back.
const requestTimeout = 5 * time.Minute

// BenchmarkRequestStart measures what issue 42 asks of requests: the time
// from a GuestSnapshot's creation to its guest starting it, p95 <= 60 s
// with the BSLS's default poll interval. Everything between is real and
// runs as on a cluster (internal/local): the API server with guestbackup's
// and KubeVirt's admission webhooks, the controller handing the request to
// the server's users Secret, the BSLS's server pod (user sync and the
// client port, from the Deployment the controller wrote) and the way back
// through the activity ConfigMap to the request's status. The guest is
// played by a client that keeps the requests script's loop exactly
// (pkg/cloudinit's requestsScript): a poll held up to
// clientdist.MaxPollWait, and, after a poll answered sooner, the rest of
// the poll interval waited out; a qemu guest would add its boot, not its
// poll.
//
// The requests come at every phase of that loop: request i is created i/N
// of (poll interval + 5 s) after the guest told the previous one's
// ending, so some find the guest waiting out its interval (the slowest
// case) and the others find its poll held. The guest answers Running, waits
// until the request's status says Running, then fails it, saying it is a
// benchmark.
//
// It reports, over the requests, p50-s, p95-s and max-s from creation to
// the guest holding the request (the goal's figure), and status-p95-s to
// the request's status saying Running, as `kubectl get` shows it.
func BenchmarkRequestStart(b *testing.B) {
	ctrllog.SetLogger(logr.Discard()) // the managers' logs are not the figures
	ctx := context.Background()
	p := local.Start(b, local.Options{Requests: true})
	port, err := testbed.FreePorts(2)
	if err != nil {
		b.Fatal(err)
	}
	for _, ns := range []string{"backup", "team-a"} {
		if err := p.API.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"backup": "allowed"}}}); err != nil {
			b.Fatal(err)
		}
	}
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage:   v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
			Access:    v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "allowed"}}},
			ClientURL: fmt.Sprintf("https://%s:%d", testbed.GuestHostAddress, port),
		},
	}
	if err := p.API.Client.Create(ctx, bsls); err != nil {
		b.Fatal(err)
	}
	if _, err := p.ServeBSLS(ctx, b, bsls, port); err != nil {
		b.Fatal(err)
	}
	if err := p.API.Client.Create(ctx, story.OwnersVM("team-a", "web", "backup/main", "/srv", "#cloud-config\n")); err != nil {
		b.Fatal(err)
	}
	g, err := newBenchGuest(ctx, p.API.Client, bsls, port+1, "team-a", "web")
	if err != nil {
		b.Fatal(err)
	}
	g.logf = b.Logf
	b.Logf("the guest polls every %s, each poll held up to %s", g.poll, clientdist.MaxPollWait)
	guestCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := g.run(guestCtx)
		if !errors.Is(err, context.Canceled) {
			b.Error(err)
		}
		g.stopped <- err
	}()
	defer func() {
		stop()
		<-done
	}()

	var toGuest, toStatus []time.Duration
	measured := 0 // requests made, each ended by the guest in turn
	for b.Loop() {
		toGuest, toStatus = toGuest[:0], toStatus[:0]
		for i := range requestsMeasured {
			b.StopTimer()
			wait := time.Duration(i) * (g.poll + 5*time.Second) / requestsMeasured
			if err := g.sleepAfterEnding(ctx, measured, wait); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			name := fmt.Sprintf("now-%d", measured)
			measured++
			req := &v1alpha1.GuestSnapshot{
				ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
				Spec:       v1alpha1.GuestSnapshotSpec{VM: "web"},
			}
			created := time.Now()
			if err := p.API.Client.Create(ctx, req); err != nil {
				b.Fatal(err)
			}
			uid := string(req.UID)
			took, err := g.received(ctx, uid)
			if err != nil {
				b.Fatal(err)
			}
			toGuest = append(toGuest, took.Sub(created))
			err = testbed.WaitFor(requestTimeout, 50*time.Millisecond, func() (bool, error) {
				cur := &v1alpha1.GuestSnapshot{}
				if err := p.API.Client.Get(ctx, client.ObjectKeyFromObject(req), cur); err != nil {
					return false, err
				}
				return cur.Status.Phase == v1alpha1.PhaseRunning, nil
			})
			if err != nil {
				b.Fatalf("GuestSnapshot %s never said Running: %v", name, err)
			}
			toStatus = append(toStatus, time.Since(created))
			g.release(uid)
			b.Logf("request %d, %s after the last ending: at the guest after %s, Running after %s", i, wait.Round(time.Second),
				toGuest[len(toGuest)-1].Round(time.Millisecond), toStatus[len(toStatus)-1].Round(time.Millisecond))
		}
	}
	b.ReportMetric(testbed.Percentile(toGuest, 50).Seconds(), "p50-s")
	b.ReportMetric(testbed.Percentile(toGuest, 95).Seconds(), "p95-s")
	b.ReportMetric(testbed.Percentile(toGuest, 100).Seconds(), "max-s")
	b.ReportMetric(testbed.Percentile(toStatus, 95).Seconds(), "status-p95-s")
	b.ReportMetric(float64(len(toGuest)), "requests")
}

// benchGuest is a VM's guest as far as requests go: the requests script's
// poll loop, with the VM's own credentials, over the server's client port
// on loopback (the port a qemu guest reaches as testbed.GuestHostAddress,
// whose certificate names that address).
type benchGuest struct {
	http           *http.Client
	logf           func(format string, args ...any)
	url            string
	user, password string
	poll           time.Duration

	mu sync.Mutex
	// took are when each request reached the guest, by UID; released
	// close when the benchmark has seen it Running; endings counts the
	// endings the guest told, the last at ended.
	took     map[string]time.Time
	arrived  chan struct{}
	released map[string]chan struct{}
	endings  int
	ended    time.Time
	// stopped tells why run ended.
	stopped chan error
}

func newBenchGuest(ctx context.Context, c client.Client, bsls *v1alpha1.BackupStorageLocationServer, clientPort int, namespace, vm string) (*benchGuest, error) {
	// The controller publishes the poll interval and the CA; the webhook
	// wrote the VM's password.
	var status v1alpha1.BackupStorageLocationServerStatus
	var password string
	err := testbed.WaitFor(2*time.Minute, 100*time.Millisecond, func() (bool, error) {
		cur := &v1alpha1.BackupStorageLocationServer{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(bsls), cur); err != nil {
			return false, err
		}
		status = cur.Status
		secret := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: vmsecret.Name(vm)}, secret); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		password = string(secret.Data[vmsecret.KeyPassword])
		return status.RequestPollInterval != nil && status.TLSCA != "" && password != "", nil
	})
	if err != nil {
		return nil, fmt.Errorf("the BSLS's poll interval and CA, and VM %s/%s's password: %w", namespace, vm, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(status.TLSCA)) {
		return nil, errors.New("the BSLS's status holds no CA")
	}
	g := &benchGuest{
		http: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: roots, ServerName: testbed.GuestHostAddress, MinVersion: tls.VersionTLS12,
		}}},
		url:  "https://127.0.0.1:" + strconv.Itoa(clientPort),
		user: identity.OfVM(vm, namespace), password: password,
		poll:     status.RequestPollInterval.Duration,
		took:     map[string]time.Time{},
		arrived:  make(chan struct{}),
		released: map[string]chan struct{}{},
		ended:    time.Now(),
		stopped:  make(chan error, 1),
		logf:     func(string, ...any) {},
	}
	// Its user reaches the server pod within seconds of the Secret.
	err = testbed.WaitFor(2*time.Minute, 200*time.Millisecond, func() (bool, error) {
		_, err := g.call(ctx, http.MethodGet, clientdist.RequestsPath, url.Values{clientdist.WaitParam: {"0"}})
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the server never let %s poll: %w", g.user, err)
	}
	return g, nil
}

// run is the requests script's loop until ctx ends.
func (g *benchGuest) run(ctx context.Context) error {
	hold := clientdist.MaxPollWait
	for {
		began := time.Now()
		data, err := g.call(ctx, http.MethodGet, clientdist.RequestsPath, url.Values{clientdist.WaitParam: {strconv.Itoa(int(hold.Seconds()))}})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			// As the script does: said, and asked again after the
			// interval.
			g.logf("the guest's poll failed: %v", err)
			data = nil
		}
		polled, err := clientdist.DecodeRequests(data)
		if err != nil {
			return fmt.Errorf("read the poll: %w", err)
		}
		for _, r := range polled {
			if err := g.take(ctx, r.UID); err != nil {
				return err
			}
		}
		took := time.Since(began)
		if took < g.poll && took < hold {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(g.poll - took):
			}
		}
	}
}

// take starts request uid, holds it until the benchmark saw it Running,
// and fails it.
func (g *benchGuest) take(ctx context.Context, uid string) error {
	g.mu.Lock()
	g.took[uid] = time.Now()
	release := make(chan struct{})
	g.released[uid] = release
	close(g.arrived)
	g.arrived = make(chan struct{})
	g.mu.Unlock()
	result := func(phase v1alpha1.RequestPhase, message string) error {
		_, err := g.call(ctx, http.MethodPost, clientdist.ResultPath, url.Values{clientdist.UIDParam: {uid}, clientdist.PhaseParam: {string(phase)}}, message)
		return err
	}
	if err := result(v1alpha1.PhaseRunning, ""); err != nil {
		return fmt.Errorf("start request %s: %w", uid, err)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-release:
	case <-time.After(requestTimeout):
	}
	if err := result(v1alpha1.PhaseFailed, "a benchmark's guest: measured, not carried out"); err != nil {
		return fmt.Errorf("end request %s: %w", uid, err)
	}
	g.mu.Lock()
	g.endings++
	g.ended = time.Now()
	g.mu.Unlock()
	return nil
}

// received waits for request uid to reach the guest and says when it did.
func (g *benchGuest) received(ctx context.Context, uid string) (time.Time, error) {
	deadline := time.After(requestTimeout)
	for {
		g.mu.Lock()
		at, ok := g.took[uid]
		arrived := g.arrived
		g.mu.Unlock()
		if ok {
			return at, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-deadline:
			return time.Time{}, fmt.Errorf("request %s never reached the guest in %s", uid, requestTimeout)
		case err := <-g.stopped:
			return time.Time{}, fmt.Errorf("the guest stopped before request %s reached it: %w", uid, err)
		case <-arrived:
		}
	}
}

// release lets the guest end request uid.
func (g *benchGuest) release(uid string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch, ok := g.released[uid]; ok {
		close(ch)
		delete(g.released, uid)
	}
}

// sleepAfterEnding waits until the guest told endings endings, then
// until d after the last.
func (g *benchGuest) sleepAfterEnding(ctx context.Context, endings int, d time.Duration) error {
	deadline := time.After(requestTimeout)
	for {
		g.mu.Lock()
		told, ended := g.endings, g.ended
		g.mu.Unlock()
		if told >= endings {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(ended.Add(d))):
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("the guest told %d endings in %s, want %d", told, requestTimeout, endings)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// call makes one call to the client port as the VM's user, with message
// as the body of a POST.
func (g *benchGuest) call(ctx context.Context, method, path string, q url.Values, message ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, clientdist.MaxPollWait+time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, g.url+path+"?"+q.Encode(), strings.NewReader(strings.Join(message, "")))
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(g.user, g.password)
	resp, err := g.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))
	}
	return data, nil
}
