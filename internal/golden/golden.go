// Package golden compares what a test renders with golden files under
// testdata, the whole directory at once: a golden that differs (stale), is
// missing, or is no longer rendered (orphan) fails the test with a diff.
// Run the test with -update to rewrite the directory instead: differing and
// missing goldens are written, orphans removed.
package golden

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata and remove orphans")

// Updating reports whether the test runs with -update.
func Updating() bool { return *update }

// Cases returns the names of the case directories under dir, in order: each
// golden test case is a directory, found rather than listed in code, so a
// new case is a new directory. A plain file there, or no case at all, fails
// the test.
func Cases(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("golden cases: %v", err)
	}
	var cases []string
	for _, e := range entries {
		if !e.IsDir() {
			t.Errorf("%s: only case directories belong in %s", e.Name(), dir)
			continue
		}
		cases = append(cases, e.Name())
	}
	if len(cases) == 0 {
		t.Fatalf("no golden cases in %s", dir)
	}
	return cases
}

// Check compares the files of dir with got, file name to content. inputs
// are files of dir a test reads rather than renders: they are neither
// compared nor orphans. Every other file of dir must be in got. With
// -update, dir is made to hold got instead.
func Check(t testing.TB, dir string, got map[string][]byte, inputs ...string) {
	t.Helper()
	if *update {
		write(t, dir, got, inputs)
		return
	}
	for _, name := range sortedKeys(got) {
		path := filepath.Join(dir, name)
		want, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%v (run the test with -update to write it)", err)
			continue
		}
		if !bytes.Equal(got[name], want) {
			t.Errorf("%s is stale (run the test with -update to rewrite it; -want +got):\n%s", path, diff(want, got[name]))
		}
	}
	for _, name := range orphans(t, dir, got, inputs) {
		t.Errorf("%s is an orphan: the test renders no such file (run it with -update to remove it)", filepath.Join(dir, name))
	}
}

// write makes dir hold exactly got and inputs.
func write(t testing.TB, dir string, got map[string][]byte, inputs []string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range sortedKeys(got) {
		if err := os.WriteFile(filepath.Join(dir, name), got[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range orphans(t, dir, got, inputs) {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// orphans are the files of dir neither in got nor inputs, in order.
// Subdirectories are other cases', not this one's.
func orphans(t testing.TB, dir string, got map[string][]byte, inputs []string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, ok := got[e.Name()]; ok || e.IsDir() || slices.Contains(inputs, e.Name()) {
			continue
		}
		out = append(out, e.Name())
	}
	return out
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// diff is a line diff of two files, -want +got.
func diff(want, got []byte) string {
	return cmp.Diff(strings.Split(string(want), "\n"), strings.Split(string(got), "\n"))
}
