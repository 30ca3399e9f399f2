package testbed

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRepoRootIsTheModulesRoot: the repository's root is found whether the
// test binary kept its sources' paths (go test) or not (make's -trimpath),
// and never stops at a tool module's go.mod.
func TestRepoRootIsTheModulesRoot(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Dir(filepath.Dir(wd)) // internal/testbed
	got, err := RepoRoot()
	if err != nil || got != want {
		t.Fatalf("RepoRoot() = %q, %v; want %q", got, err, want)
	}
}

func TestDeclares(t *testing.T) {
	for _, c := range []struct {
		mod  string
		want bool
	}{
		{"module github.com/guestbackup/guestbackup\n\ngo 1.26.0\n", true},
		{"// a comment\nmodule \"github.com/guestbackup/guestbackup\"\n", true},
		{"module github.com/guestbackup/guestbackup/hack/tools/kopia\n", false},
		{"go 1.26\n", false},
	} {
		if got := declares([]byte(c.mod), modulePath); got != c.want {
			t.Errorf("declares(%q) = %v, want %v", c.mod, got, c.want)
		}
	}
}
