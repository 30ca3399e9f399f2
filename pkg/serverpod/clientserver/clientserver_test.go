package clientserver

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
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
