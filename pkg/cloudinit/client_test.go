package cloudinit

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/serverpod/clientserver"
)

// clientPort is a server pod's client port on loopback, with the Kopia
// server's CA, serving binaries (which a test may tamper with).
type clientPort struct {
	url    string
	status v1alpha1.ClientStatus
	mu     sync.Mutex
	got    map[string]activity.Report
	user   string
	pass   string
}

func (c *clientPort) Authenticate(user, password string) bool {
	return user == c.user && password == c.pass
}

func (c *clientPort) Report(user string, r activity.Report) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got[user] = r
}

func (c *clientPort) reports() map[string]activity.Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]activity.Report{}
	for k, v := range c.got {
		out[k] = v
	}
	return out
}

func startClientPort(t *testing.T, ca *pki.CA, binaries map[string]string, user, password string) *clientPort {
	t.Helper()
	return startClientPortWith(t, ca, binaries, user, password, nil)
}

// startClientPortWith is startClientPort that carries requests.
func startClientPortWith(t *testing.T, ca *pki.CA, binaries map[string]string, user, password string, requests clientserver.Requests) *clientPort {
	t.Helper()
	c := &clientPort{got: map[string]activity.Report{}, user: user, pass: password}
	srv, err := clientserver.Open(clientserver.Options{Binaries: binaries, Authenticator: c, Reporter: c, Requests: requests})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	chainFile, keyFile, err := testbed.WriteServingCert(t.TempDir(), ca, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- clientserver.Serve(ctx, ln, chainFile, keyFile, srv.Handler())
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("client port: %v", err)
		}
	})
	c.url = "https://" + ln.Addr().String()
	c.status = srv.Status()
	c.status.URL = c.url
	return c
}

// onlyTools makes a PATH of the host's commands the scripts need plus
// those given (the downloader under test), and nothing else: no kopia, no
// other downloader.
func onlyTools(t *testing.T, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range append([]string{"sh", "cat", "cut", "date", "mkdir", "chmod", "printf", "tail", "uname", "cp", "mv", "rm", "tr", "base64", "sleep", "sha256sum", "echo", "dirname"}, extra...) {
		p, err := exec.LookPath(name)
		if name == "python3" {
			// python3 on PATH may be another interpreter's shim: the
			// system's is what a guest has.
			p, err = exec.LookPath("/usr/bin/python3")
		}
		if err != nil {
			t.Skipf("the host has no %s", name)
		}
		if err := os.Symlink(p, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// serverWithWeb is a real Kopia server with the user web@team-a, and its
// password.
func serverWithWeb(t *testing.T) (*testbed.KopiaServer, string) {
	t.Helper()
	srv := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	password := testbed.RandomPassword()
	srv.AddUser(t, "web@team-a", password)
	return srv, password
}

func clientBinaries(t *testing.T) map[string]string {
	tools := testbed.MustTools(t)
	return map[string]string{"amd64": tools.Kopia, "arm64": tools.KopiaARM64}
}

// A guest without kopia fetches the server's client with whichever of
// curl, wget and python3 it has, trusting the server's CA only, verifies
// it, installs it under LibDir and backs up with it.
func TestConnectScriptFetchesTheServersClient(t *testing.T) {
	srv, password := serverWithWeb(t)
	port := startClientPort(t, srv.CA, clientBinaries(t), "web@team-a", password)
	for _, downloader := range []string{"curl", "wget", "python3"} {
		t.Run(downloader, func(t *testing.T) {
			data := t.TempDir()
			if err := os.WriteFile(filepath.Join(data, "notes.txt"), []byte("keep me\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			client := port.status
			b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Paths: []string{data}, Client: &client}
			box := newSandbox(t, b, "kopia")
			box.env = append(box.env, "PATH="+onlyTools(t, downloader))
			out, err := box.run(ConnectScript)
			if err != nil {
				t.Fatalf("connect: %v\n%s", err, out)
			}
			if !strings.Contains(out, "fetching kopia "+client.Version+" for amd64 from "+port.url+"/kopia/linux-amd64") ||
				!strings.Contains(out, "installed kopia") || !strings.Contains(box.status(), "connected to "+srv.URL) {
				t.Fatalf("status %q\n%s", box.status(), out)
			}
			if out, err := box.run(SnapshotScript); err != nil || !strings.Contains(out, "snapshot of "+data+" taken") {
				t.Fatalf("snapshot with the fetched client: %v\n%s", err, out)
			}
			if out, err := box.run(ConnectScript); err != nil || !strings.Contains(out, "already connected") || strings.Contains(out, "fetching") {
				t.Errorf("a second boot fetches again or reconnects: %v\n%s", err, out)
			}
		})
	}
}

// A guest whose own kopia is the server's very build uses it without a
// download: copied into LibDir once its SHA-256 matched.
func TestConnectScriptUsesItsOwnKopiaOfTheServersBuild(t *testing.T) {
	tools := testbed.MustTools(t)
	srv, password := serverWithWeb(t)
	client := v1alpha1.ClientStatus{URL: "https://127.0.0.1:1", Version: "v0.0.0", SHA256: map[string]string{}}
	// Nothing listens at the URL: a download would fail.
	port := startClientPort(t, srv.CA, clientBinaries(t), "", "")
	client.SHA256 = port.status.SHA256
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Client: &client}
	box := newSandbox(t, b, tools.Kopia)
	out, err := box.run(ConnectScript)
	if err != nil || strings.Contains(out, "fetching") || !strings.Contains(out, "installed kopia v0.0.0 ("+client.SHA256["amd64"]+") from this guest's "+tools.Kopia) {
		t.Fatalf("connect: %v\n%s", err, out)
	}
}

// A guest whose own kopia is another build never runs it: its copy fails
// the check, is discarded without a refusal (nothing was tampered with),
// and the server's client is downloaded, verified and used instead.
func TestConnectScriptDownloadsWhenItsOwnKopiaIsAnotherBuild(t *testing.T) {
	srv, password := serverWithWeb(t)
	port := startClientPort(t, srv.CA, clientBinaries(t), "web@team-a", password)
	ran := filepath.Join(t.TempDir(), "ran")
	other := filepath.Join(t.TempDir(), "kopia")
	if err := os.WriteFile(other, []byte("#!/bin/sh\ntouch "+ran+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	client := port.status
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Client: &client}
	box := newSandbox(t, b, other)
	box.env = append(box.env, "PATH="+onlyTools(t, "curl"))
	out, err := box.run(ConnectScript)
	if err != nil || !strings.Contains(out, "installed kopia "+client.Version+" ("+client.SHA256["amd64"]+") from "+port.url+"/kopia/linux-amd64") ||
		!strings.Contains(box.status(), "connected to "+srv.URL) {
		t.Fatalf("connect: %v, status %q\n%s", err, box.status(), out)
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Errorf("the guest's own kopia of another build ran (%v)", err)
	}
	if got := port.reports(); len(got) != 0 {
		t.Errorf("a guest's own kopia of another build was reported as a refused client: %v", got)
	}
	if _, err := os.Stat(filepath.Join(box.root, LibDir, "kopia.new")); !os.IsNotExist(err) {
		t.Errorf("the copy of the guest's own kopia outlived its check (%v)", err)
	}
}

// A tampered binary (the server, or something between it and the guest,
// serves other bytes than the bootstrap's SHA-256) is never run, never
// installed, recorded in the guest's status and reported to the server
// as the guest's Kopia user.
func TestConnectScriptRefusesATamperedClient(t *testing.T) {
	tools := testbed.MustTools(t)
	srv, password := serverWithWeb(t)
	genuine := startClientPort(t, srv.CA, clientBinaries(t), "", "")
	ran := filepath.Join(t.TempDir(), "ran")
	tampered := filepath.Join(t.TempDir(), "kopia")
	if err := os.WriteFile(tampered, []byte("#!/bin/sh\ntouch "+ran+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	evil := startClientPort(t, srv.CA, map[string]string{"amd64": tampered, "arm64": tools.KopiaARM64}, "web@team-a", password)
	client := evil.status
	client.SHA256 = genuine.status.SHA256 // what the BSLS published
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Client: &client}
	box := newSandbox(t, b, "kopia")
	box.env = append(box.env, "PATH="+onlyTools(t, "curl"))
	out, err := box.run(ConnectScript)
	if err == nil {
		t.Fatalf("connected with a tampered client:\n%s", out)
	}
	st := box.status()
	if !strings.Contains(st, "error: refused the kopia client from "+evil.url+"/kopia/linux-amd64: its SHA-256 is ") ||
		!strings.Contains(st, "not "+client.SHA256["amd64"]) || !strings.Contains(st, "it was not run") {
		t.Errorf("status: %q\n%s", st, out)
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Errorf("the tampered binary ran (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(box.root, LibDir, "kopia")); !os.IsNotExist(err) {
		t.Errorf("the tampered binary was installed (%v)", err)
	}
	got := evil.reports()["web@team-a"]
	if got.Kind != clientdist.ReportChecksumMismatch || !strings.Contains(got.Message, "it was not run") {
		t.Errorf("the server got the report %+v (all: %v)\n%s", got, evil.reports(), out)
	}
	for _, name := range []string{"report.header", "report.txt"} {
		if _, err := os.Stat(filepath.Join(box.root, StateDir, name)); !os.IsNotExist(err) {
			t.Errorf("%s (which holds the password) outlived the report (%v)", name, err)
		}
	}
}
