package mutate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// TestDiskModeSecretAloneConnectsAGuest takes the Secret the webhook writes
// for a disk-mode VM, lays its keys out as the secret disk presents them,
// runs its install.sh into a sandbox root and then the installed connect
// and snapshot scripts, against a real Kopia server and the real kopia
// client: nothing but the Secret's content reaches the "guest".
func TestDiskModeSecretAloneConnectsAGuest(t *testing.T) {
	tools := testbed.MustTools(t)
	srv := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	server := readyServer()
	server.BSLS.Status.Endpoint, server.BSLS.Status.TLSCA = srv.URL, string(srv.CA.CertPEM())
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "report.txt"), []byte("quarterly\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vm := readVM(t, "mode-disk")
	vm = []byte(strings.Replace(string(vm), `"/home"`, `"`+data+`"`, 1))
	d, err := Decide(Input{Object: vm, Namespace: "team-a", Server: server, NewPassword: NewPassword})
	if err != nil || d.Denied != "" {
		t.Fatalf("decide: %v %s", err, d.Denied)
	}
	// The controller provisions the user from the same Secret.
	srv.AddUser(t, string(d.Secret.Data[v1alpha1.SecretKeyUsername]), string(d.Secret.Data[v1alpha1.SecretKeyPassword]))

	disk, root := t.TempDir(), t.TempDir()
	for key, value := range d.Secret.Data {
		if err := os.WriteFile(filepath.Join(disk, key), value, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := testbed.Run(t.Context(), time.Minute, root, []string{"DESTDIR=" + root}, "/bin/sh", filepath.Join(disk, v1alpha1.SecretKeyInstall)); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(root, cloudinit.ConfDir, "password")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("installed password: %v, mode %v", err, fi.Mode().Perm())
	}
	env := []string{
		"GUESTBACKUP_CONF_DIR=" + filepath.Join(root, cloudinit.ConfDir),
		"GUESTBACKUP_STATE_DIR=" + filepath.Join(root, cloudinit.StateDir),
		"GUESTBACKUP_ATTEMPTS=2",
		"GUESTBACKUP_ROOT=" + root,
		"KOPIA=" + tools.Kopia,
	}
	if out, err := testbed.Run(t.Context(), 2*time.Minute, root, env, filepath.Join(root, cloudinit.ConnectScript)); err != nil {
		t.Fatalf("connect: %v\n%s", err, out)
	}
	if out, err := testbed.Run(t.Context(), 2*time.Minute, root, env, filepath.Join(root, cloudinit.SnapshotScript)); err != nil || !strings.Contains(out, "snapshot of "+data+" taken") {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	list, err := testbed.Run(t.Context(), time.Minute, root, env, filepath.Join(root, cloudinit.KopiaCommand), "snapshot", "list", "--json", data)
	if err != nil || !strings.Contains(list, `"host":"team-a","userName":"files"`) {
		t.Errorf("no snapshot of %s as files@team-a: %v\n%s", data, err, list)
	}
	timer, err := os.ReadFile(filepath.Join(root, cloudinit.UnitDir, cloudinit.SnapshotTimer))
	if err != nil || !strings.Contains(string(timer), "OnCalendar=*-*-* 03:00:00") {
		t.Errorf("the timer does not carry the VM's schedule: %v\n%s", err, timer)
	}
}
