package cloudinit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// guestScripts is every shell script a guest may run, as the bootstrap
// renders it in each of its shapes: the executable files, cloud-init's
// bootcmd, the secret disk's install.sh, and the disk unit's script.
func guestScripts(t *testing.T) map[string][]byte {
	t.Helper()
	full := testBootstrap(t)
	full.Paths = []string{"/srv/data"}
	full.Client = testClient()
	full.RequestPoll = 30 * time.Second
	scripts := map[string][]byte{"guestbackup-disk": GuestDiskScript}
	for name, b := range map[string]Bootstrap{"connect-only": testBootstrap(t), "full": full} {
		files, err := b.Files()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if f.Mode&0o111 != 0 {
				scripts[name+filepath.Base(f.Path)] = f.Content
			}
		}
		cc, err := CloudConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			BootCmd []string `json:"bootcmd"`
		}
		if err := yaml.Unmarshal(cc, &doc); err != nil || len(doc.BootCmd) != 1 {
			t.Fatalf("%s: want one bootcmd: %v", name, err)
		}
		// cloud-init runs bootcmd with sh.
		scripts[name+"-bootcmd"] = []byte("#!/bin/sh\n" + doc.BootCmd[0])
		disk, err := DiskFiles(b)
		if err != nil {
			t.Fatal(err)
		}
		scripts[name+"-install.sh"] = disk["install.sh"]
	}
	for name, s := range scripts {
		if !strings.HasPrefix(string(s), "#!/bin/sh\n") {
			t.Errorf("%s does not start with #!/bin/sh: guest scripts are POSIX sh", name)
		}
	}
	return scripts
}

// The guest scripts are POSIX sh: shellcheck (as sh) and checkbashisms
// find nothing in any of them. Both tools come from hack/tools.sh; a
// missing one fails the test rather than skipping it.
func TestGuestScriptsArePortable(t *testing.T) {
	testbed.RequireTestBed(t)
	linters := map[string][]string{
		"GUESTBACKUP_SHELLCHECK":    {"--shell=sh", "--severity=style", "--norc"},
		"GUESTBACKUP_CHECKBASHISMS": {"--posix", "--extra"},
	}
	scripts := guestScripts(t)
	dir := t.TempDir()
	for name, content := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for env, args := range linters {
		tool := os.Getenv(env)
		if tool == "" {
			t.Fatalf("%s is not set: run make tools, then eval \"$(hack/tools.sh env)\"", env)
		}
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s=%s: %v (run make tools)", env, tool, err)
		}
		for name := range scripts {
			out, err := testbed.Run(t.Context(), time.Minute, dir, nil, tool, append(args, name)...)
			if err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("%s %s: %v\n%s", filepath.Base(tool), name, err, out)
			}
		}
	}
}

// The linters find what they are there to find: a sample with a bashism
// fails both.
func TestGuestScriptLintersCatchBashisms(t *testing.T) {
	testbed.RequireTestBed(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\nif [[ $RANDOM == 1 ]]; then echo $'x'; fi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, env := range []string{"GUESTBACKUP_SHELLCHECK", "GUESTBACKUP_CHECKBASHISMS"} {
		tool := os.Getenv(env)
		if tool == "" {
			t.Fatalf("%s is not set: run make tools", env)
		}
		// A missing linter must not pass for one that found the bashism.
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s=%s: %v (run make tools)", env, tool, err)
		}
		if out, err := testbed.Run(t.Context(), time.Minute, dir, nil, tool, bad); err == nil {
			t.Errorf("%s finds nothing wrong with a bashism:\n%s", filepath.Base(tool), out)
		}
	}
}
