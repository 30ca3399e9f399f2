package testbed

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Build compiles one of the repository's commands (e.g. "./cmd/server") into
// the test's temporary folder and returns the binary's path. Go's build
// cache makes every build after the first a link.
func Build(tb TB, pkg string) string {
	tb.Helper()
	root, err := RepoRoot()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	// The developer's own Go environment: its module and build caches.
	return goBuild(tb, root, pkg, tb.TempDir(), nil)
}

// goBuild builds pkg in the module at dir, with env added to the
// developer's own Go environment, into the folder outDir.
func goBuild(tb TB, dir, pkg, outDir string, env []string, flags ...string) string {
	tb.Helper()
	out := filepath.Join(outDir, filepath.Base(pkg))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append(append([]string{"build"}, flags...), "-o", out, pkg)...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	if output, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s in %s: %v\n%s", pkg, dir, err, output)
	}
	return out
}
