package clientserver

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/onsi/gomega"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

type guests struct {
	mu      sync.Mutex
	reports map[string]activity.Report
}

func (g *guests) Authenticate(user, password string) bool {
	return user == "web@team-a" && password == "the-right-password-0123"
}

func (g *guests) Report(user string, r activity.Report) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reports[user] = r
}

func start(t *testing.T) (*Server, *httptest.Server, *guests) {
	t.Helper()
	tools := testbed.MustTools(t)
	g := &guests{reports: map[string]activity.Report{}}
	srv, err := Open(Options{Binaries: map[string]string{"amd64": tools.Kopia, "arm64": tools.KopiaARM64}, Authenticator: g, Reporter: g, MaxDownloads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return srv, ts, g
}

func sum(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// What the server publishes is what it serves: the SHA-256 and version of
// each binary, read from the binary without running it.
func TestServesWhatItPublishes(t *testing.T) {
	tools := testbed.MustTools(t)
	srv, ts, _ := start(t)
	st := srv.Status()
	if !strings.HasPrefix(st.Version, "v") {
		t.Errorf("version %q", st.Version)
	}
	for arch, path := range map[string]string{"amd64": tools.Kopia, "arm64": tools.KopiaARM64} {
		if st.SHA256[arch] != sum(t, path) {
			t.Errorf("%s: published %s, the file's is %s", arch, st.SHA256[arch], sum(t, path))
		}
		resp, err := http.Get(ts.URL + clientdist.DownloadPath(arch))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		_, err = io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || hex.EncodeToString(h.Sum(nil)) != st.SHA256[arch] {
			t.Errorf("%s: %v, status %d, served bytes of another SHA-256", arch, err, resp.StatusCode)
		}
	}
	if resp, err := http.Get(ts.URL + clientdist.DownloadPath("mips")); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("an architecture it does not serve: %v %v", err, resp.StatusCode)
	}
	if err := clientdist.Validate(&st); err != nil {
		t.Errorf("published client: %v", err)
	}
	if _, err := clientdist.Decode(clientdist.Encode(st)); err != nil {
		t.Errorf("round trip: %v", err)
	}
}

// A report is accepted only with the guest's own credentials and a known
// kind, and its message is made fit for an Event.
func TestReportsNeedTheGuestsCredentials(t *testing.T) {
	_, ts, g := start(t)
	post := func(user, password, kind, body string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, ts.URL+clientdist.ReportPath+"?kind="+kind, strings.NewReader(body))
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for name, tt := range map[string]struct {
		user, password, kind string
		want                 int
	}{
		"anonymous":      {"", "", clientdist.ReportChecksumMismatch, http.StatusUnauthorized},
		"wrong password": {"web@team-a", "a-guess-of-the-password", clientdist.ReportChecksumMismatch, http.StatusUnauthorized},
		"another user":   {"db@team-a", "the-right-password-0123", clientdist.ReportChecksumMismatch, http.StatusUnauthorized},
		"unknown kind":   {"web@team-a", "the-right-password-0123", "anything", http.StatusBadRequest},
	} {
		if got := post(tt.user, tt.password, tt.kind, "x"); got != tt.want {
			t.Errorf("%s: status %d, want %d", name, got, tt.want)
		}
	}
	if len(g.reports) != 0 {
		t.Fatalf("refused reports were kept: %v", g.reports)
	}
	if got := post("web@team-a", "the-right-password-0123", clientdist.ReportChecksumMismatch, "bad\nsum\x1b[31m "+strings.Repeat("x", 2000)); got != http.StatusNoContent {
		t.Fatalf("the guest's own report: status %d", got)
	}
	r := g.reports["web@team-a"]
	if r.Kind != clientdist.ReportChecksumMismatch || !strings.HasPrefix(r.Message, "bad sum[31m") || len(r.Message) > clientdist.MaxReportMessage || r.At.IsZero() {
		t.Errorf("report kept as %+v", r)
	}
}

// Beyond MaxDownloads at once, a download is told to come back.
func TestDownloadsAreBounded(t *testing.T) {
	srv, ts, _ := start(t)
	srv.downloads <- struct{}{} // one download in flight
	defer func() { <-srv.downloads }()
	resp, err := http.Get(ts.URL + clientdist.DownloadPath("amd64"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

func TestOpenRefusesMixedVersionsAndMissingFiles(t *testing.T) {
	if _, err := Open(Options{Binaries: map[string]string{"amd64": filepath.Join(t.TempDir(), "none")}}); err == nil {
		t.Error("opened a missing binary")
	}
	notGo := filepath.Join(t.TempDir(), "kopia")
	if err := os.WriteFile(notGo, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tools := testbed.MustTools(t)
	if _, err := Open(Options{Binaries: map[string]string{"amd64": tools.Kopia, "arm64": notGo}}); err == nil {
		t.Error("served two architectures of different versions")
	}
}

// port serves srv as the server pod does (Serve: TLS, HTTP/2, its
// timeouts) on 127.0.0.1 until the test ends, and returns its address and
// the roots that trust it. Call it before opening any connection to it, so
// that those are closed before it stops; it then waits for every download
// in flight to end.
func port(t *testing.T, srv *Server) (string, *x509.CertPool) {
	t.Helper()
	ca, err := pki.NewCA("client port test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	chainFile, keyFile, err := testbed.WriteServingCert(t.TempDir(), ca, nil, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, chainFile, keyFile, srv.Handler()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("client port: %v", err)
		}
		// The clients are gone: every download's next write fails.
		gomega.NewWithT(t).Eventually(func() int { return len(srv.downloads) }).
			WithTimeout(time.Minute).WithPolling(50*time.Millisecond).Should(gomega.BeZero(), "downloads still in flight")
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return ln.Addr().String(), roots
}

// from dials from the loopback address source.
func from(source net.IP) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: source}, Timeout: 30 * time.Second}
}

// stall starts a download of amd64's client from source and never reads
// its body, as a hostile or stuck client: over HTTP/1.1 on a TLS
// connection of its own, or over HTTP/2 through Go's transport. It returns
// the status, the Retry-After and, for a refusal, the message; the test
// closes the connection when it ends.
func stall(t *testing.T, addr string, roots *x509.CertPool, source net.IP, http2 bool) (status int, retryAfter, message string) {
	t.Helper()
	var resp *http.Response
	if http2 {
		tr := &http.Transport{DialContext: from(source).DialContext, TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		var err error
		if resp, err = (&http.Client{Transport: tr}).Get("https://" + addr + clientdist.DownloadPath("amd64")); err != nil {
			t.Fatal(err)
		}
		// Closing the body resets the stream; the transport then closes
		// the connection.
		t.Cleanup(func() { resp.Body.Close() })
		if resp.ProtoMajor != 2 {
			t.Fatalf("%s: %s, not HTTP/2", source, resp.Proto)
		}
	} else {
		conn, err := tls.DialWithDialer(from(source), "tcp", addr, &tls.Config{RootCAs: roots})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		// A bound on the test's own wait, not on the server's behaviour.
		if err := conn.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", clientdist.DownloadPath("amd64"), addr); err != nil {
			t.Fatal(err)
		}
		// Its body is never closed (that would read it to the end): the
		// connection is.
		if resp, err = http.ReadResponse(bufio.NewReader(conn), nil); err != nil {
			t.Fatal(err)
		}
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		message = string(body)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), message
}

// fetch downloads amd64's client from source as a guest does, over
// HTTP/2 when the server speaks it (curl does), and returns the status and
// the SHA-256 of the bytes it got.
func fetch(t *testing.T, addr string, roots *x509.CertPool, source net.IP) (int, string, http.Header) {
	t.Helper()
	tr := &http.Transport{DialContext: from(source).DialContext, TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + clientdist.DownloadPath("amd64"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	if _, err := io.Copy(h, resp.Body); err != nil {
		t.Fatalf("download from %s: %v", source, err)
	}
	return resp.StatusCode, hex.EncodeToString(h.Sum(nil)), resp.Header
}

// bigKopia is the test bed's kopia client, checked to be larger than the
// socket buffers of a loopback connection can take (some MB), so that a
// client that does not read really holds up the server's writes.
func bigKopia(t *testing.T) string {
	t.Helper()
	path := testbed.MustTools(t).Kopia
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < 64<<20 {
		t.Fatalf("%s has %d bytes: too few to fill the socket buffers", path, fi.Size())
	}
	return path
}

var (
	guest    = net.IPv4(127, 0, 0, 1)
	attacker = net.IPv4(127, 0, 0, 2)
)

// Downloads need no credentials, so one host can open MaxDownloads
// downloads and never reads them. A guest booting then still gets its
// client, fetching as the bootstrap's curl does (--retry 3 --retry-delay
// 5): the host holds only MaxDownloadsPerSource slots. Before, it held
// every slot and the guest got 503 four times.
func TestStalledDownloadsLockNoGuestOut(t *testing.T) {
	srv, err := Open(Options{Binaries: map[string]string{"amd64": bigKopia(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	addr, roots := port(t, srv)
	for range srv.opts.MaxDownloads {
		stall(t, addr, roots, attacker, false)
	}
	var status int
	var got string
	for attempt := range 4 {
		var h http.Header
		if status, got, h = fetch(t, addr, roots, guest); status != http.StatusServiceUnavailable {
			break
		}
		wait, err := strconv.Atoi(h.Get("Retry-After"))
		if err != nil {
			t.Fatalf("503 with Retry-After %q", h.Get("Retry-After"))
		}
		t.Logf("attempt %d: 503, retrying in %d s", attempt+1, wait)
		if attempt < 3 {
			time.Sleep(time.Duration(wait) * time.Second)
		}
	}
	if status != http.StatusOK || got != srv.Status().SHA256["amd64"] {
		t.Fatalf("the guest got status %d and bytes of SHA-256 %s, want 200 and %s", status, got, srv.Status().SHA256["amd64"])
	}
}

// A client that stops reading has its download cut once it falls below
// MinRate, and its slot is free again: MaxDownloads of them, from as many
// addresses, lock no one out for long. Each cut is logged with its address.
func TestStalledDownloadsAreCut(t *testing.T) {
	var mu sync.Mutex
	var logged []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{Verbosity: 1})
	srv, err := Open(Options{Binaries: map[string]string{"amd64": bigKopia(t)}, MinRate: 2 << 20, Grace: time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	addr, roots := port(t, srv)
	var sources []net.IP
	for i := range srv.opts.MaxDownloads {
		source := net.IPv4(127, 0, 0, byte(2+i))
		sources = append(sources, source)
		// Half over each protocol: a guest's curl speaks HTTP/2.
		if status, _, msg := stall(t, addr, roots, source, i%2 == 0); status != http.StatusOK {
			t.Fatalf("download %d from %s: %d %s", i, source, status, msg)
		}
	}
	g := gomega.NewWithT(t)
	g.Eventually(func() int {
		status, got, _ := fetch(t, addr, roots, guest)
		if status == http.StatusOK && got != srv.Status().SHA256["amd64"] {
			t.Fatalf("served bytes of SHA-256 %s", got)
		}
		return status
	}).WithTimeout(2*time.Minute).WithPolling(200*time.Millisecond).Should(gomega.Equal(http.StatusOK), "no slot was released")
	g.Eventually(func() []string {
		mu.Lock()
		defer mu.Unlock()
		var cut []string
		for _, source := range sources {
			for _, line := range logged {
				if strings.Contains(line, "download cut") && strings.Contains(line, `"`+source.String()+":") {
					cut = append(cut, source.String())
					break
				}
			}
		}
		return cut
	}).WithTimeout(2*time.Minute).WithPolling(50*time.Millisecond).Should(gomega.HaveLen(len(sources)), "stalled downloads not all cut")
	g.Eventually(func() int { return len(srv.downloads) }).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).Should(gomega.BeZero())
}

// One address gets MaxDownloadsPerSource downloads at once; the next is
// told so and to come back, while another address still gets its own.
func TestDownloadsPerSourceAreBounded(t *testing.T) {
	// No download is cut while the test runs, however slow the machine.
	srv, err := Open(Options{Binaries: map[string]string{"amd64": bigKopia(t)}, Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	addr, roots := port(t, srv)
	for i := range srv.opts.MaxDownloadsPerSource {
		if status, _, msg := stall(t, addr, roots, attacker, i%2 == 0); status != http.StatusOK {
			t.Fatalf("download %d: %d %s", i, status, msg)
		}
	}
	for _, http2 := range []bool{false, true} {
		status, retryAfter, msg := stall(t, addr, roots, attacker, http2)
		if status != http.StatusServiceUnavailable || retryAfter == "" || !strings.Contains(msg, "too many downloads from "+attacker.String()) {
			t.Errorf("one more from %s (HTTP/2 %t): %d, Retry-After %q, %q", attacker, http2, status, retryAfter, msg)
		}
	}
	if status, got, _ := fetch(t, addr, roots, net.IPv4(127, 0, 0, 3)); status != http.StatusOK || got != srv.Status().SHA256["amd64"] {
		t.Errorf("another address: status %d, SHA-256 %s", status, got)
	}
}

// deadlines is a ResponseWriter that keeps the last write deadline set
// through its ResponseController.
type deadlines struct {
	*httptest.ResponseRecorder
	deadline time.Time
}

func (d *deadlines) SetWriteDeadline(t time.Time) error {
	d.deadline = t
	return nil
}

// The minimum rate is an average since the download started: a write gets
// until the bytes so far must have been taken, never less than writeFloor;
// but a download already behind is cut at its next write rather than given
// writeFloor again, or a client taking a chunk every few seconds would keep
// its slot for hours.
func TestDownloadPaceIsAnAverage(t *testing.T) {
	const rate = 1 << 10
	start := time.Now().Add(-time.Minute)
	paced := func(written int64) (*pacedWriter, *deadlines) {
		w := &deadlines{ResponseRecorder: httptest.NewRecorder()}
		return &pacedWriter{ResponseWriter: w, rc: http.NewResponseController(w), start: start, grace: 15 * time.Second, rate: rate, written: written}, w
	}
	chunk := make([]byte, rate)

	// Ahead by 55 s: until its bytes, this chunk's included, are due.
	p, w := paced(100 * rate)
	if _, err := p.Write(chunk); err != nil || !w.deadline.Equal(start.Add(15*time.Second+101*time.Second)) {
		t.Errorf("ahead: %v, deadline %v after the start, want 116s", err, w.deadline.Sub(start))
	}

	// Ahead by 3 s: this chunk is due in 4 s, but gets writeFloor.
	p, w = paced(48 * rate)
	before := time.Now()
	_, err := p.Write(chunk)
	after := time.Now()
	if err != nil || w.deadline.Before(before.Add(writeFloor)) || w.deadline.After(after.Add(writeFloor)) {
		t.Errorf("nearly due: %v, deadline %v from now, want %v", err, time.Until(w.deadline), writeFloor)
	}

	// Behind by 5 s: cut, and what is buffered fails at once too.
	p, w = paced(40 * rate)
	before = time.Now()
	if n, err := p.Write(chunk); n != 0 || err == nil || !p.slow || w.deadline.IsZero() || w.deadline.After(time.Now()) || w.Body.Len() != 0 {
		t.Errorf("behind: wrote %d, %v, slow %t, deadline %v from %v", n, err, p.slow, w.deadline.Sub(before), before)
	}
}

// desk holds two guests' requests, as user sync does.
type desk struct {
	mu       sync.Mutex
	requests []userset.Request
	results  []string
	// progress are the restores' progress told, "user uid restored".
	progress []string
	changed  chan struct{}
}

// add lists r too, and wakes the held polls.
func (d *desk) add(r userset.Request) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.requests = append(d.requests, r)
	if d.changed != nil {
		close(d.changed)
		d.changed = nil
	}
}

func (d *desk) Changed(string) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.changed == nil {
		d.changed = make(chan struct{})
	}
	return d.changed
}

func (d *desk) Authenticate(user, password string) bool {
	return password == "pw-of-"+user+"-0123456789"
}

func (d *desk) Report(string, activity.Report) {}

func (d *desk) Pending(user string) ([]userset.Request, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []userset.Request
	for _, r := range d.requests {
		if r.User == user {
			out = append(out, r)
		}
	}
	return out, nil
}

func (d *desk) Result(_ context.Context, user, uid, phase, message string) error {
	d.mu.Lock()
	requests := slices.Clone(d.requests)
	d.mu.Unlock()
	for _, r := range requests {
		if r.User == user && r.UID == uid {
			d.mu.Lock()
			defer d.mu.Unlock()
			if phase == "Running" && slices.ContainsFunc(d.results, func(res string) bool { return strings.HasPrefix(res, user+" "+uid+" ") }) {
				return ErrRequestEnded
			}
			d.results = append(d.results, strings.Join([]string{user, uid, phase, message}, " "))
			return nil
		}
	}
	return ErrUnknownRequest
}

func (d *desk) Progress(_ context.Context, user, uid string, restored int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.ContainsFunc(d.requests, func(r userset.Request) bool { return r.User == user && r.UID == uid }) {
		return ErrUnknownRequest
	}
	if slices.ContainsFunc(d.results, func(res string) bool { return strings.HasPrefix(res, user+" "+uid+" ") }) {
		return ErrRequestEnded
	}
	d.progress = append(d.progress, fmt.Sprintf("%s %s %d", user, uid, restored))
	return nil
}

func (d *desk) Plan(context.Context, string, string) ([]clientdist.PlanStep, error) { return nil, nil }

// A guest polls for its own requests and answers them, with its own
// credentials; it can neither read nor answer another guest's.
func TestRequestsAreTheGuestsOwn(t *testing.T) {
	tools := testbed.MustTools(t)
	web := userset.Request{UID: "5d1e0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "before-upgrade", Paths: []string{"/srv/my files"}, Tags: map[string]string{"why": "upgrade"}}
	db := userset.Request{UID: "5d1e0000-0000-4000-8000-000000000002", User: "db@team-a", Kind: userset.RequestSnapshot, Name: "nightly", Paths: []string{"/var/lib/db"}}
	d := &desk{requests: []userset.Request{web, db}}
	srv, err := Open(Options{Binaries: map[string]string{"amd64": tools.Kopia}, Authenticator: d, Reporter: d, Requests: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	do := func(method, user, query string) (int, string) {
		t.Helper()
		path := clientdist.RequestsPath
		if method == http.MethodPost {
			path = clientdist.ResultPath
		}
		req, _ := http.NewRequest(method, ts.URL+path+query, strings.NewReader("done\nat last"))
		if user != "" {
			req.SetBasicAuth(user, "pw-of-"+user+"-0123456789")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := do(http.MethodGet, "", ""); code != http.StatusUnauthorized {
		t.Errorf("anonymous poll: status %d", code)
	}
	code, body := do(http.MethodGet, "web@team-a", "")
	if want := string(clientdist.EncodeRequests([]userset.Request{web})); code != http.StatusOK || body != want {
		t.Errorf("web's poll: status %d, body:\n%s\nwant its own request only:\n%s", code, body, want)
	}
	if code, _ := do(http.MethodPost, "db@team-a", "?uid="+web.UID+"&phase=Succeeded"); code != http.StatusNotFound {
		t.Errorf("db answering web's request: status %d, want 404", code)
	}
	if code, _ := do(http.MethodPost, "web@team-a", "?uid="+web.UID+"&phase=Done"); code != http.StatusBadRequest {
		t.Errorf("a phase that is none: status %d, want 400", code)
	}

	// How far a restore got: told by its guest alone, as a count of the
	// plan's paths, and never in an ending.
	for _, bad := range []string{"&restored=0", "&restored=-1", "&restored=65", "&restored=two", "&restored="} {
		if code, _ := do(http.MethodPost, "web@team-a", "?uid="+web.UID+"&phase=Running"+bad); code != http.StatusBadRequest {
			t.Errorf("progress %q: status %d, want 400", bad, code)
		}
	}
	if code, _ := do(http.MethodPost, "web@team-a", "?uid="+web.UID+"&phase=Succeeded&restored=1"); code != http.StatusBadRequest {
		t.Errorf("progress in an ending: status %d, want 400", code)
	}
	if code, _ := do(http.MethodPost, "db@team-a", "?uid="+web.UID+"&phase=Running&restored=1"); code != http.StatusNotFound {
		t.Errorf("db telling the progress of web's request: status %d, want 404", code)
	}
	if code, body := do(http.MethodPost, "web@team-a", "?uid="+web.UID+"&phase=Running&restored=2"); code != http.StatusNoContent || body != "" {
		t.Errorf("web telling its own progress: status %d (%q), want 204 and no plan", code, body)
	}
	if want := []string{"web@team-a " + web.UID + " 2"}; !slices.Equal(d.progress, want) {
		t.Errorf("progress recorded: %q, want %q", d.progress, want)
	}

	if code, _ := do(http.MethodPost, "web@team-a", "?uid="+web.UID+"&phase=Succeeded"); code != http.StatusNoContent {
		t.Errorf("web answering its own request: status %d", code)
	}
	if code, _ := do(http.MethodPost, "web@team-a", "?uid="+web.UID+"&phase=Running&restored=3"); code != http.StatusConflict {
		t.Errorf("progress after the ending: status %d, want 409", code)
	}
	if code, body := do(http.MethodPost, "web@team-a", "?uid="+web.UID+"&phase=Running"); code != http.StatusConflict || !strings.Contains(body, "has ended") {
		t.Errorf("web starting its request again, after it ended: status %d (%q), want 409: the guest must not carry it out twice", code, body)
	}
	if want := []string{"web@team-a " + web.UID + " Succeeded done at last"}; !slices.Equal(d.results, want) {
		t.Errorf("results recorded: %q, want %q", d.results, want)
	}
}

// A restore into a claim is a Job's: the guest's poll never lists it, and
// the Job's poll, naming its UID, lists it alone; neither the guest's other
// requests nor another VM's Job request.
func TestJobRequestsAreTheJobsAlone(t *testing.T) {
	tools := testbed.MustTools(t)
	guest := userset.Request{UID: "70b00000-0000-4000-8000-000000000001", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "before-upgrade", Paths: []string{"/srv"}}
	job := userset.Request{UID: "70b00000-0000-4000-8000-000000000002", User: "web@team-a", Kind: userset.RequestRestore, Name: "to-claim", Paths: []string{"/srv"},
		Source: "web@team-a", Target: userset.ClaimFolder("to-claim"), Job: true}
	other := userset.Request{UID: "70b00000-0000-4000-8000-000000000003", User: "db@team-a", Kind: userset.RequestRestore, Name: "db-to-claim", Paths: []string{"/var/lib/db"},
		Source: "db@team-a", Target: userset.ClaimFolder("db-to-claim"), Job: true}
	d := &desk{requests: []userset.Request{guest, job, other}}
	srv, err := Open(Options{Binaries: map[string]string{"amd64": tools.Kopia}, Authenticator: d, Reporter: d, Requests: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	poll := func(user, query string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, ts.URL+clientdist.RequestsPath+query, nil)
		req.SetBasicAuth(user, "pw-of-"+user+"-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s's poll %q: status %d: %s", user, query, resp.StatusCode, body)
		}
		return string(body)
	}
	for _, tt := range []struct {
		name, user, query string
		want              []userset.Request
	}{
		{"the guest's poll", "web@team-a", "", []userset.Request{guest}},
		{"the Job's poll", "web@team-a", "?uid=" + job.UID, []userset.Request{job}},
		{"a poll naming the guest's own request", "web@team-a", "?uid=" + guest.UID, nil},
		{"a poll naming another VM's Job request", "web@team-a", "?uid=" + other.UID, nil},
	} {
		if got, want := poll(tt.user, tt.query), string(clientdist.EncodeRequests(tt.want)); got != want {
			t.Errorf("%s: answered\n%s\nwant\n%s", tt.name, got, want)
		}
	}
}

// A poll that asks to wait is held until a request is addressed to its
// guest, its wait ends, or the pod stops; a guest holds no more than its
// share, and a wait that is no number is refused.
func TestHeldPolls(t *testing.T) {
	tools := testbed.MustTools(t)
	d := &desk{}
	done := make(chan struct{})
	srv, err := Open(Options{Binaries: map[string]string{"amd64": tools.Kopia}, Authenticator: d, Reporter: d, Requests: d, Done: done})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	type answer struct {
		code int
		body string
	}
	poll := func(user, wait string) <-chan answer {
		out := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodGet, ts.URL+clientdist.RequestsPath+"?"+clientdist.WaitParam+"="+wait, nil)
			req.SetBasicAuth(user, "pw-of-"+user+"-0123456789")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				out <- answer{code: -1, body: err.Error()}
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			out <- answer{resp.StatusCode, string(body)}
		}()
		return out
	}
	held := func(user string) int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.heldPerUser[user]
	}
	// holding waits, boundedly, until the server holds n polls of user.
	holding := func(user string, n int) {
		t.Helper()
		for i := 0; held(user) != n; i++ {
			if i == 500 {
				t.Fatalf("the server holds %d polls of %s, want %d", held(user), user, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	web := userset.Request{UID: "5d1e0000-0000-4000-8000-000000000003", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "now", Paths: []string{"/srv"}}
	db := userset.Request{UID: "5d1e0000-0000-4000-8000-000000000004", User: "db@team-a", Kind: userset.RequestSnapshot, Name: "now", Paths: []string{"/var/lib/db"}}

	first := poll("web@team-a", "240")
	holding("web@team-a", 1)
	// Another guest's request wakes it: it finds nothing of its own, and
	// waits on (its answer, below, is its own request).
	d.add(db)
	second := poll("web@team-a", "240")
	holding("web@team-a", 2)
	if a := <-poll("web@team-a", "240"); a.code != http.StatusOK || a.body != "" {
		t.Errorf("a third held poll of one guest: %d %q, want an empty answer at once", a.code, a.body)
	}
	d.add(web)
	want := string(clientdist.EncodeRequests([]userset.Request{web}))
	for _, p := range []<-chan answer{first, second} {
		if a := <-p; a.code != http.StatusOK || a.body != want {
			t.Errorf("a held poll, once a request is addressed to its guest: %d %q, want %q", a.code, a.body, want)
		}
	}
	holding("web@team-a", 0)

	if a := <-poll("web@team-a", "240"); a.body != want {
		t.Errorf("a poll that finds a request pending is answered at once: %q", a.body)
	}
	if a := <-poll("nobody@team-a", "1"); a.code != http.StatusOK || a.body != "" {
		t.Errorf("a held poll whose wait ends: %d %q, want an empty answer", a.code, a.body)
	}
	if a := <-poll("web@team-a", "soon"); a.code != http.StatusBadRequest {
		t.Errorf("a wait that is no number: %d, want 400", a.code)
	}
	stopping := poll("other@team-a", "240")
	holding("other@team-a", 1)
	close(done)
	if a := <-stopping; a.code != http.StatusOK || a.body != "" {
		t.Errorf("a held poll when the pod stops: %d %q, want an empty answer", a.code, a.body)
	}
}
