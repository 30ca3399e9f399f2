package testbed

import (
	"context"
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
	out := filepath.Join(tb.TempDir(), filepath.Base(pkg))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The developer's own Go environment: its module and build caches.
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = root
	if output, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", pkg, err, output)
	}
	return out
}
