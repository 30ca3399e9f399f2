package cloudinit

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// sandbox writes a bootstrap's files under a folder, as they would land in
// a guest, and runs its scripts there against the real kopia binary.
type sandbox struct {
	t    *testing.T
	root string
	env  []string
}

func newSandbox(t *testing.T, b Bootstrap, kopia string) *sandbox {
	t.Helper()
	files, err := b.Files()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.Content, os.FileMode(f.Mode)); err != nil {
			t.Fatal(err)
		}
	}
	return &sandbox{t: t, root: root, env: []string{
		"GUESTBACKUP_CONF_DIR=" + filepath.Join(root, ConfDir),
		"GUESTBACKUP_STATE_DIR=" + filepath.Join(root, StateDir),
		"GUESTBACKUP_ATTEMPTS=2",
		"KOPIA=" + kopia,
	}}
}

func (s *sandbox) run(script string) (string, error) {
	// HOME is the sandbox's root (Run's default), so kopia's configuration
	// lands there, not in the host's home.
	return testbed.Run(s.t.Context(), 2*time.Minute, s.root, s.env, filepath.Join(s.root, script))
}

func (s *sandbox) status() string {
	data, _ := os.ReadFile(filepath.Join(s.root, StateDir, "status"))
	return string(data)
}

func TestConnectScriptConnectsWithOnlyTheInjectedFiles(t *testing.T) {
	tools := testbed.MustTools(t)
	srv := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	password := testbed.RandomPassword()
	srv.AddUser(t, "web@team-a", password)
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "notes.txt"), []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 3, Paths: []string{data}}
	box := newSandbox(t, b, tools.Kopia)

	out, err := box.run(ConnectScript)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, out)
	}
	if !strings.Contains(box.status(), "connected to "+srv.URL+" as web@team-a (credentials generation 3)") {
		t.Errorf("status after connecting: %q", box.status())
	}
	if out, err := box.run(ConnectScript); err != nil || !strings.Contains(out, "already connected") {
		t.Errorf("a second run (a reboot) should do nothing: %v\n%s", err, out)
	}
	if out, err := box.run(SnapshotScript); err != nil || !strings.Contains(out, "snapshot of "+data+" taken") {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	list, err := testbed.Run(t.Context(), time.Minute, box.root, box.env, filepath.Join(box.root, KopiaCommand), "snapshot", "list", "--json", data)
	if err != nil || !strings.Contains(list, `"host":"team-a","userName":"web"`) {
		t.Errorf("the owner's %s lists no snapshot of %s as web@team-a: %v\n%s", KopiaCommand, data, err, list)
	}
	for _, name := range []string{"guestbackup.conf", "password"} {
		if fi, err := os.Stat(filepath.Join(box.root, ConfDir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", name, err, fi.Mode().Perm())
		}
	}
}

func TestConnectScriptSaysWhyItCannotConnect(t *testing.T) {
	tools := testbed.MustTools(t)
	srv := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	srv.AddUser(t, "web@team-a", testbed.RandomPassword())
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: testbed.RandomPassword(), Generation: 1}

	box := newSandbox(t, b, tools.Kopia)
	if out, err := box.run(ConnectScript); err == nil {
		t.Fatalf("connected with a wrong password:\n%s", out)
	}
	if st := box.status(); !strings.Contains(st, "error: cannot connect to "+srv.URL+" as web@team-a after 2 attempts") || !strings.Contains(st, "access denied") {
		t.Errorf("status: %q", st)
	}

	missing := newSandbox(t, b, filepath.Join(t.TempDir(), "no-kopia-here"))
	if out, err := missing.run(ConnectScript); err == nil {
		t.Fatalf("succeeded without kopia:\n%s", out)
	}
	if st := missing.status(); !strings.Contains(st, "error: kopia is not installed in this guest") {
		t.Errorf("status: %q", st)
	}
}

// A server that sends the guest's CA after a leaf it signed with a key of
// its own (the CA certificate is public: every handshake carries it) is
// what a fingerprint pin lets in. The guest must refuse it before sending
// its password: the impostor knows no user, so a refusal for the password
// would mean the password was sent.
func TestConnectScriptRefusesAServerThatOnlyCarriesItsCA(t *testing.T) {
	tools := testbed.MustTools(t)
	genuine := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	impostor := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{AlsoPresent: []*x509.Certificate{genuine.CA.Cert}})
	b := Bootstrap{ServerURL: impostor.URL, CA: genuine.CA.CertPEM(), Username: "web@team-a", Password: testbed.RandomPassword(), Generation: 1}

	box := newSandbox(t, b, tools.Kopia)
	if out, err := box.run(ConnectScript); err == nil {
		t.Fatalf("connected to the impostor:\n%s", out)
	}
	st := box.status()
	if !strings.Contains(st, "certificate signed by unknown authority") {
		t.Errorf("status does not say the server's certificate is untrusted: %q", st)
	}
	if strings.Contains(st, "access denied") || strings.Contains(st, "Unauthenticated") {
		t.Errorf("the guest sent its credentials to the impostor: %q", st)
	}
}
