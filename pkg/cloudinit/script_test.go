package cloudinit

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"sigs.k8s.io/yaml"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/rehash"
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
	// This boot brought the bootstrap, as its bootcmd says.
	files = append(files, File{Path: BootMarker, Mode: 0o644, Content: []byte("1\n")})
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
		"GUESTBACKUP_LIB_DIR=" + filepath.Join(root, LibDir),
		"GUESTBACKUP_ATTEMPTS=2",
		"GUESTBACKUP_ROOT=" + root,
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

// A later boot's bootstrap reaches kopia: when its files changed (another
// server and CA, as after a new clientURL or a renewed CA; new paths) the
// connect service connects again, which also takes a first snapshot of the
// paths; when nothing changed it keeps its connection.
func TestConnectScriptConnectsAgainWhenItsFilesChange(t *testing.T) {
	tools := testbed.MustTools(t)
	old := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	moved := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	password := testbed.RandomPassword()
	old.AddUser(t, "web@team-a", password)
	moved.AddUser(t, "web@team-a", password)
	b := Bootstrap{ServerURL: old.URL, CA: old.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Paths: []string{"/srv/data"}}
	box := newSandbox(t, b, tools.Kopia)
	if out, err := box.run(ConnectScript); err != nil {
		t.Fatalf("connect: %v\n%s", err, out)
	}
	// boot installs b's files as the next boot's bootstrap would, and runs
	// the connect service.
	boot := func(b Bootstrap) string {
		t.Helper()
		files, err := b.Files()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(box.root, f.Path), f.Content, os.FileMode(f.Mode)); err != nil {
				t.Fatal(err)
			}
		}
		out, err := box.run(ConnectScript)
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, out)
		}
		return out
	}
	if out := boot(b); !strings.Contains(out, "already connected") {
		t.Errorf("nothing changed, yet it connected again:\n%s", out)
	}
	b.ServerURL, b.CA = moved.URL, moved.CA.CertPEM()
	if out := boot(b); strings.Contains(out, "already connected") || !strings.Contains(box.status(), "connected to "+moved.URL) {
		t.Errorf("a new server and CA: status %q\n%s", box.status(), out)
	}
	b.Paths = []string{"/srv/data", "/srv/more"}
	if out := boot(b); strings.Contains(out, "already connected") {
		t.Errorf("new paths, and no new connection (and so no first snapshot of them):\n%s", out)
	}
}

// A boot that brought no bootstrap follows an opt-out: the connect service
// disconnects kopia and removes the credentials, the scripts and the
// units, and says so.
func TestConnectScriptOptsOutAtABootWithoutTheBootstrap(t *testing.T) {
	tools := testbed.MustTools(t)
	srv := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	password := testbed.RandomPassword()
	srv.AddUser(t, "web@team-a", password)
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Paths: []string{t.TempDir()}}
	box := newSandbox(t, b, tools.Kopia)
	if out, err := box.run(ConnectScript); err != nil {
		t.Fatalf("connect: %v\n%s", err, out)
	}
	script, err := os.ReadFile(filepath.Join(box.root, ConnectScript))
	if err != nil {
		t.Fatal(err)
	}
	// The next boot: /run is empty, and the VM's cloud-init has no
	// guestbackup part any more.
	if err := os.Remove(filepath.Join(box.root, BootMarker)); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(t.TempDir(), "guestbackup-connect")
	if err := os.WriteFile(kept, script, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := testbed.Run(t.Context(), 2*time.Minute, box.root, box.env, kept)
	if err != nil {
		t.Fatalf("connect at a boot without the bootstrap: %v\n%s", err, out)
	}
	if st := box.status(); !strings.Contains(st, "opted out") {
		t.Errorf("status: %q", st)
	}
	for _, p := range []string{ConfDir, KopiaCommand, ConnectScript, SnapshotScript, UnitDir + "/" + SnapshotTimer, UnitDir + "/" + ConnectUnit} {
		if _, err := os.Stat(filepath.Join(box.root, p)); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the opt-out (%v)", p, err)
		}
	}
	if out, err := testbed.Run(t.Context(), time.Minute, box.root, box.env, tools.Kopia, "repository", "status"); err == nil {
		t.Errorf("kopia is still connected after the opt-out:\n%s", out)
	}
}

// The bootstrap's bootcmd, as cloud-init runs it at every boot, installs
// the files with their modes, and a later boot's bootstrap replaces them:
// a new password takes effect, and paths that are gone take the snapshot
// files with them.
func TestBootcmdInstallsTheBootstrapAtEveryBoot(t *testing.T) {
	root := t.TempDir()
	boot := func(b Bootstrap) {
		t.Helper()
		cc, err := CloudConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			BootCmd []string `json:"bootcmd"`
		}
		if err := yaml.Unmarshal(cc, &doc); err != nil || len(doc.BootCmd) != 1 {
			t.Fatalf("want one bootcmd, got %d: %v", len(doc.BootCmd), err)
		}
		// As cloud-init's bootcmd runs it: one sh script of its lines.
		script := filepath.Join(t.TempDir(), "bootcmd.sh")
		if err := os.WriteFile(script, []byte("#!/bin/sh\n"+doc.BootCmd[0]), 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := testbed.Run(t.Context(), time.Minute, root, []string{"GUESTBACKUP_ROOT=" + root}, "/bin/sh", script); err != nil {
			t.Fatalf("bootcmd: %v\n%s", err, out)
		}
	}
	first := testBootstrap(t)
	first.Paths = []string{"/srv/data"}
	boot(first)
	files, _ := first.Files()
	for _, f := range files {
		got, err := os.ReadFile(filepath.Join(root, f.Path))
		if err != nil || string(got) != string(f.Content) {
			t.Errorf("%s: %v, content %q, want %q", f.Path, err, got, f.Content)
			continue
		}
		if fi, _ := os.Stat(filepath.Join(root, f.Path)); fi.Mode().Perm() != os.FileMode(f.Mode) {
			t.Errorf("%s: mode %v, want %#o", f.Path, fi.Mode().Perm(), f.Mode)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, ConfDir)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("%s: %v, mode %v; want the usual 0755 of a folder (its files keep their own)", ConfDir, err, fi.Mode().Perm())
	}
	if marker, err := os.ReadFile(filepath.Join(root, BootMarker)); err != nil || string(marker) != "1\n" {
		t.Errorf("boot marker: %q, %v", marker, err)
	}

	second := testBootstrap(t)
	second.Password, second.Generation = "another-password-of-the-second-generation", 2
	boot(second)
	if got, _ := os.ReadFile(filepath.Join(root, ConfDir, "password")); string(got) != second.Password {
		t.Errorf("the second boot's password file holds %q", got)
	}
	for _, p := range snapshotFiles {
		if _, err := os.Stat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s outlived the paths (%v)", p, err)
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

// The snapshot script reads every file again while the server names its
// guest in a rehash notice (package rehash), and only then: the notice of
// another guest, which the access rules keep it from reading, changes
// nothing.
func TestSnapshotScriptReadsEveryFileAgainWhenTheServerAsks(t *testing.T) {
	tools := testbed.MustTools(t)
	ctx := t.Context()
	srv := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	r, err := repo.Open(ctx, srv.ConfigFile, srv.RepoPassword, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	if _, err := kopiauser.SyncACLs(ctx, r, kopiauser.DefaultACLs()); err != nil {
		t.Fatal(err)
	}
	box := func(user string) (*sandbox, string) {
		password := testbed.RandomPassword()
		srv.AddUser(t, user, password)
		data := t.TempDir()
		if err := os.WriteFile(filepath.Join(data, "notes.txt"), []byte("keep me\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		b := newSandbox(t, Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: user, Password: password, Generation: 1, Paths: []string{data}}, tools.Kopia)
		if out, err := b.run(ConnectScript); err != nil {
			t.Fatalf("connect %s: %v\n%s", user, err, out)
		}
		return b, data
	}
	web, webData := box("web@team-a")
	db, dbData := box("db@team-a")
	// snapshot runs the script and says how many files the snapshot it
	// took read, and how many it took unread from the previous one.
	snapshot := func(b *sandbox, data string) (out string, read, unread int) {
		t.Helper()
		out, err := b.run(SnapshotScript)
		if err != nil {
			t.Fatalf("snapshot: %v\n%s", err, out)
		}
		list, err := testbed.Run(ctx, time.Minute, b.root, b.env, filepath.Join(b.root, KopiaCommand), "snapshot", "list", "--json", data)
		if err != nil {
			t.Fatalf("snapshot list: %v\n%s", err, list)
		}
		var snapshots []struct {
			Stats struct {
				Cached    int `json:"cachedFiles"`
				NonCached int `json:"nonCachedFiles"`
			} `json:"stats"`
		}
		if err := json.Unmarshal([]byte(list), &snapshots); err != nil || len(snapshots) == 0 {
			t.Fatalf("snapshot list: %v\n%s", err, list)
		}
		last := snapshots[len(snapshots)-1].Stats
		return out, last.NonCached, last.Cached
	}
	for _, g := range []struct {
		b    *sandbox
		data string
	}{{web, webData}, {db, dbData}} {
		snapshot(g.b, g.data)
		if _, read, unread := snapshot(g.b, g.data); read != 0 || unread != 1 {
			t.Fatalf("an unchanged file with no notice: read %d, unread %d; want it taken from the previous snapshot", read, unread)
		}
	}

	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "test"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		_, err := w.PutManifest(ctx, map[string]string{
			manifest.TypeLabelKey: rehash.ManifestType, rehash.LabelUsername: "web", rehash.LabelHostname: "team-a",
		}, rehash.Notice{Paths: []string{webData}, Reason: "test"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	out, read, unread := snapshot(web, webData)
	if read != 1 || unread != 0 || !strings.Contains(out, "read every file again") {
		t.Errorf("with a notice: read %d, unread %d; want the file read again\n%s", read, unread, out)
	}
	if out, read, unread := snapshot(db, dbData); read != 0 || unread != 1 || strings.Contains(out, "read every file again") {
		t.Errorf("another guest's notice: read %d, unread %d\n%s", read, unread, out)
	}
}
