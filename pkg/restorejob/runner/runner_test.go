package runner

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/restorejob"
	"github.com/guestbackup/guestbackup/pkg/serverpod/clientserver"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// server is the requests side of a server pod's client port, as user sync
// keeps it for one user: its requests, the plan of each restore, and the
// answers taken.
type server struct {
	user, password string
	mu             sync.Mutex
	requests       []userset.Request
	plans          map[string][]clientdist.PlanStep
	answers        []string
	// progress are the restores' progress told, "uid restored".
	progress []string
}

func (s *server) Authenticate(user, password string) bool {
	return user == s.user && password == s.password
}

func (s *server) Report(string, activity.Report) {}

func (s *server) Changed(string) <-chan struct{} { return make(chan struct{}) }

func (s *server) Pending(user string) ([]userset.Request, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(s.requests), func(r userset.Request) bool {
		return r.User != user || slices.ContainsFunc(s.answers, func(a string) bool {
			return strings.HasPrefix(a, r.UID+" Succeeded") || strings.HasPrefix(a, r.UID+" Failed")
		})
	}), nil
}

func (s *server) Result(_ context.Context, user, uid, phase, message string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.ContainsFunc(s.requests, func(r userset.Request) bool { return r.User == user && r.UID == uid }) {
		return clientserver.ErrUnknownRequest
	}
	if phase == "Running" && slices.ContainsFunc(s.answers, func(a string) bool { return strings.HasPrefix(a, uid+" ") && !strings.HasPrefix(a, uid+" Running") }) {
		return clientserver.ErrRequestEnded
	}
	s.answers = append(s.answers, uid+" "+phase+" "+message)
	return nil
}

func (s *server) Progress(_ context.Context, user, uid string, restored int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.ContainsFunc(s.requests, func(r userset.Request) bool { return r.User == user && r.UID == uid }) {
		return clientserver.ErrUnknownRequest
	}
	s.progress = append(s.progress, fmt.Sprintf("%s %d", uid, restored))
	return nil
}

func (s *server) Plan(_ context.Context, _, uid string) ([]clientdist.PlanStep, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.plans[uid], nil
}

func (s *server) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.answers)
}

// A restore Job polls for its one request under the VM's identity, starts
// it, restores with the real kopia client from a real Kopia server what
// the server chose into the claim's folder of the request, byte for byte
// with modes, and tells how it ended. It overwrites nothing in the claim,
// follows no symbolic link of it, and gives up, saying so, on a request
// the server does not list.
func TestRunRestoresIntoTheClaim(t *testing.T) {
	tools := testbed.MustTools(t)
	ctx := t.Context()
	kopiaServer := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	password := testbed.RandomPassword()
	kopiaServer.AddUser(t, "web@team-a", password)

	data := filepath.Join(t.TempDir(), "srv data")
	for name, f := range map[string]struct {
		content string
		mode    os.FileMode
	}{"sub/b.txt": {"first b\n", 0o640}, "sub/deeper/c.txt": {"first c\n", 0o600}, "a.txt": {"first a\n", 0o644}} {
		p := filepath.Join(data, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.content), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	guest := testbed.NewKopiaClient(t)
	if out, err := guest.Connect(ctx, kopiaServer.URL, kopiaServer.CA.CertPEM(), "web@team-a", password); err != nil {
		t.Fatalf("connect as the VM's guest: %v\n%s", err, out)
	}
	if out, err := guest.Run(ctx, "snapshot", "create", data); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	ids, err := guest.SnapshotIDs(ctx, data)
	if err != nil || len(ids) != 1 {
		t.Fatalf("snapshot IDs %v: %v", ids, err)
	}

	srv := &server{user: "web@team-a", password: password, plans: map[string][]clientdist.PlanStep{}}
	clientURL := startClientPort(t, kopiaServer, srv)
	claim := t.TempDir()
	run := func(uid, name string, listed bool, paths ...string) error {
		t.Helper()
		r := userset.Request{UID: uid, User: "web@team-a", Kind: userset.RequestRestore, Name: name, Paths: paths, Source: "web@team-a",
			Target: userset.ClaimFolder(name), Job: true}
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
		srv.mu.Lock()
		if listed {
			srv.requests = append(srv.requests, r)
		}
		for _, p := range paths {
			srv.plans[uid] = append(srv.plans[uid], clientdist.PlanStep{ID: ids[0], Root: data, Path: p})
		}
		srv.mu.Unlock()
		return Run(ctx, Config{ServerURL: kopiaServer.URL, ClientURL: clientURL, CA: kopiaServer.CA.CertPEM(), User: "web@team-a", Password: password,
			Request: uid, Claim: claim, Scratch: t.TempDir(), Kopia: tools.Kopia, ListWait: 5 * time.Second, Log: testr.New(t)})
	}

	const first = "70b00000-0000-4000-8000-000000000001"
	if err := run(first, "first", true, filepath.Join(data, "sub"), filepath.Join(data, "a.txt")); err != nil {
		t.Fatal(err)
	}
	if got := srv.got(); len(got) != 2 || got[0] != first+" Running " || !strings.HasPrefix(got[1], first+" Succeeded "+filepath.Join(data, "sub")+": Restored 2 files") {
		t.Fatalf("answers %q, want Running, then Succeeded with what kopia restored", got)
	}
	// How far it got, told between the paths: the ending tells the rest.
	if want := []string{first + " 1"}; !slices.Equal(srv.progress, want) {
		t.Errorf("progress told %q, want %q", srv.progress, want)
	}
	for _, name := range []string{"a.txt", "sub/b.txt", "sub/deeper/c.txt"} {
		original, restored := filepath.Join(data, name), filepath.Join(claim, "first", data, name)
		want, _ := os.ReadFile(original)
		got, err := os.ReadFile(restored)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s holds %q (%v), want %q", restored, got, err, want)
		}
		wi, _ := os.Stat(original)
		if gi, err := os.Stat(restored); err != nil || gi.Mode() != wi.Mode() {
			t.Errorf("%s has mode %v (%v), want %v", restored, gi.Mode(), err, wi.Mode())
		}
	}

	// A run after the request ended finds it no longer listed: it writes
	// nothing and tells nothing.
	if err := Run(ctx, Config{ServerURL: kopiaServer.URL, ClientURL: clientURL, CA: kopiaServer.CA.CertPEM(), User: "web@team-a", Password: password,
		Request: first, Claim: claim, Scratch: t.TempDir(), Kopia: tools.Kopia, ListWait: 2 * time.Second, Log: testr.New(t)}); err == nil ||
		!strings.Contains(err.Error(), "waited 2s for the server to list request "+first) {
		t.Errorf("a run after the request ended: %v", err)
	}

	// A run after one that restored but could not tell it (the server
	// restarting): it tells the same ending again, and restores nothing
	// twice.
	srv.mu.Lock()
	told := srv.answers[1]
	srv.answers = srv.answers[:0]
	srv.mu.Unlock()
	if err := run(first, "first", false, filepath.Join(data, "a.txt")); err != nil {
		t.Fatal(err)
	}
	if got := srv.got(); len(got) != 1 || got[0] != told {
		t.Errorf("answers %q, want the kept ending %q told again", got, told)
	}

	// Into a folder the claim holds already: nothing is overwritten.
	const again = "70b00000-0000-4000-8000-000000000002"
	if err := os.WriteFile(filepath.Join(claim, "first", data, "a.txt"), []byte("the owner's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(again, "first", true, filepath.Join(data, "a.txt")); err != nil {
		t.Fatal(err)
	}
	if got := srv.got(); got[len(got)-1] != again+" Failed /first exists already in the claim: restore into a new claim, or remove it" {
		t.Errorf("answer %q, want a failure: the folder is there", got[len(got)-1])
	}
	if b, _ := os.ReadFile(filepath.Join(claim, "first", data, "a.txt")); string(b) != "the owner's\n" {
		t.Errorf("a restore overwrote what it found: %q", b)
	}

	// What an earlier run left (a pod evicted halfway), a link to
	// elsewhere even, is thrown away, never followed: the folder holds
	// all of the restore or nothing.
	const partial = "70b00000-0000-4000-8000-000000000003"
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(claim, ".partial.incomplete")); err != nil {
		t.Fatal(err)
	}
	if err := run(partial, "partial", true, filepath.Join(data, "a.txt")); err != nil {
		t.Fatal(err)
	}
	if got := srv.got(); !strings.HasPrefix(got[len(got)-1], partial+" Succeeded "+filepath.Join(data, "a.txt")+": Restored 1 files") {
		t.Errorf("answer %q, want a success", got[len(got)-1])
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("a restore wrote through a symbolic link: %v", entries)
	}
	if b, err := os.ReadFile(filepath.Join(claim, "partial", data, "a.txt")); err != nil || string(b) != "first a\n" {
		t.Errorf("partial/a.txt: %q (%v)", b, err)
	}

	// A request the server does not list (the guest's, or none): the Job
	// gives up, saying so, and answers nothing.
	const unlisted = "70b00000-0000-4000-8000-000000000004"
	before := len(srv.got())
	if err := run(unlisted, "unlisted", false, filepath.Join(data, "a.txt")); err == nil || !strings.Contains(err.Error(), "is the GuestRestore still Pending or Running?") {
		t.Errorf("an unlisted request: %v", err)
	}
	if got := srv.got(); len(got) != before {
		t.Errorf("answers to an unlisted request: %q", got[before:])
	}
}

// startClientPort serves srv's requests on a client port with TLS of
// kopiaServer's CA, on loopback, until the test ends; it returns its URL.
func startClientPort(t *testing.T, kopiaServer *testbed.KopiaServer, srv *server) string {
	t.Helper()
	port, err := clientserver.Open(clientserver.Options{Binaries: map[string]string{"amd64": testbed.MustTools(t).Kopia}, Authenticator: srv, Reporter: srv, Requests: srv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(port.Close)
	chainFile, keyFile, err := testbed.WriteServingCert(t.TempDir(), kopiaServer.CA, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- clientserver.Serve(ctx, ln, chainFile, keyFile, port.Handler()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("client port: %v", err)
		}
	})
	return "https://" + ln.Addr().String()
}

// FromEnv reads the environment the controller's Job sets, with the
// contract's mounts, and says which variable is missing or wrong.
func TestFromEnv(t *testing.T) {
	full := map[string]string{restorejob.EnvServerURL: "https://main.backup.svc:51515", restorejob.EnvClientURL: "https://main.backup.svc:51516",
		restorejob.EnvCA: "PEM", restorejob.EnvUser: "web@team-a", restorejob.EnvPassword: "secret", restorejob.EnvRequest: "70b00000-0000-4000-8000-000000000001"}
	c, err := FromEnv(func(k string) string { return full[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Claim != restorejob.ClaimMount || c.Scratch != restorejob.ScratchMount || c.Kopia != restorejob.Kopia || c.User != "web@team-a" || c.Password != "secret" {
		t.Errorf("config %+v", c)
	}
	for name, tt := range map[string]struct{ key, value, want string }{
		"no password":     {restorejob.EnvPassword, "", restorejob.EnvPassword + " is not set"},
		"no request":      {restorejob.EnvRequest, "", restorejob.EnvRequest + " is not set"},
		"not an identity": {restorejob.EnvUser, "web", `GUESTBACKUP_USER="web" is no <vm>@<namespace> identity`},
	} {
		env := map[string]string{}
		for k, v := range full {
			env[k] = v
		}
		env[tt.key] = tt.value
		if _, err := FromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", name, err, tt.want)
		}
	}
}
