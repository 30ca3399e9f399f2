package kopiaserver_test

import (
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// TestImageHoldsTheServerPodsBinaries checks that the image the Dockerfile
// builds puts kopia and guestbackup-server where the server pod spec runs
// them from: no container engine runs here, so a renamed path would
// otherwise only show on a cluster.
func TestImageHoldsTheServerPodsBinaries(t *testing.T) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var lastStage []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 && fields[0] == "FROM" {
			lastStage = nil
		}
		lastStage = append(lastStage, line)
	}
	installed := map[string]bool{}
	for _, line := range lastStage {
		fields := strings.Fields(line)
		if len(fields) < 3 || fields[0] != "COPY" || !strings.HasPrefix(fields[1], "--from=") {
			continue
		}
		dest := fields[len(fields)-1]
		for _, src := range fields[2 : len(fields)-1] {
			installed[path.Join(dest, path.Base(src))] = true
		}
	}
	for _, binary := range []string{kopiaserver.KopiaBinary, kopiaserver.ServerBinary, "/usr/local/bin/controller", "/usr/local/bin/webhook"} {
		if !installed[binary] {
			t.Errorf("the image's final stage installs no %s (it installs %v)", binary, installed)
		}
	}
}
