package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing, so
// that the helper's own failures can be asserted.
type recorder struct {
	testing.TB
	errors []string
	fatal  bool
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// Fatalf records and stops the calling goroutine, as testing's does.
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	r.fatal = true
	panic(r)
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

// run calls f with a recorder and returns what it recorded.
func run(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != r {
				panic(p)
			}
		}()
		f(r)
	}()
	return r
}

// setUpdate sets -update for one test.
func setUpdate(t *testing.T, v bool) {
	old := *update
	*update = v
	t.Cleanup(func() { *update = old })
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		name    string
		files   map[string]string
		got     map[string]string
		inputs  []string
		wantErr []string // substrings, one per recorded failure
	}{
		{
			name:   "equal, with an input",
			files:  map[string]string{"input.yaml": "in", "a.yaml": "a\n"},
			got:    map[string]string{"a.yaml": "a\n"},
			inputs: []string{"input.yaml"},
		},
		{
			name:    "stale",
			files:   map[string]string{"a.yaml": "one\ntwo\n"},
			got:     map[string]string{"a.yaml": "one\nthree\n"},
			wantErr: []string{`a.yaml is stale (run the test with -update to rewrite it; -want +got):`},
		},
		{
			name:    "missing",
			files:   map[string]string{},
			got:     map[string]string{"a.yaml": "a"},
			wantErr: []string{"a.yaml: no such file or directory (run the test with -update to write it)"},
		},
		{
			name:    "orphan",
			files:   map[string]string{"a.yaml": "a", "old.yaml": "gone"},
			got:     map[string]string{"a.yaml": "a"},
			wantErr: []string{"old.yaml is an orphan: the test renders no such file (run it with -update to remove it)"},
		},
		{
			name:    "an input not declared is an orphan",
			files:   map[string]string{"input.yaml": "in"},
			got:     map[string]string{},
			wantErr: []string{"input.yaml is an orphan"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, tt.files)
			got := map[string][]byte{}
			for k, v := range tt.got {
				got[k] = []byte(v)
			}
			r := run(t, func(tb testing.TB) { Check(tb, dir, got, tt.inputs...) })
			if len(r.errors) != len(tt.wantErr) {
				t.Fatalf("failures %q, want %d matching %q", r.errors, len(tt.wantErr), tt.wantErr)
			}
			for i, want := range tt.wantErr {
				if !strings.Contains(r.errors[i], want) {
					t.Errorf("failure %q, want one containing %q", r.errors[i], want)
				}
			}
		})
	}
}

// TestCheckShowsADiff: a stale golden's failure shows the lines that
// differ, want then got.
func TestCheckShowsADiff(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.txt": "same\nold line\n"})
	r := run(t, func(tb testing.TB) { Check(tb, dir, map[string][]byte{"a.txt": []byte("same\nnew line\n")}) })
	// go-cmp's spacing is deliberately unstable: match the lines' marks
	// and contents only.
	removed, added := regexp.MustCompile(`(?m)^-.*"old line"`), regexp.MustCompile(`(?m)^\+.*"new line"`)
	if len(r.errors) != 1 || !removed.MatchString(r.errors[0]) || !added.MatchString(r.errors[0]) {
		t.Fatalf("failures %q, want one with a -want +got diff of the line", r.errors)
	}
}

// TestUpdate: -update makes the directory hold what was rendered, keeps
// inputs and other cases' directories, and then Check passes.
func TestUpdate(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"input.yaml": "in", "stale.yaml": "old", "orphan.yaml": "x"})
	if err := os.Mkdir(filepath.Join(dir, "other-case"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{"stale.yaml": []byte("new"), "missing.yaml": []byte("m")}
	setUpdate(t, true)
	if r := run(t, func(tb testing.TB) { Check(tb, dir, got, "input.yaml") }); len(r.errors) != 0 {
		t.Fatalf("update failed: %q", r.errors)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"input.yaml", "missing.yaml", "other-case", "stale.yaml"}; !slices.Equal(names, want) {
		t.Errorf("after -update the directory holds %q, want %q", names, want)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "stale.yaml")); string(data) != "new" {
		t.Errorf("stale.yaml = %q after -update", data)
	}
	setUpdate(t, false)
	if r := run(t, func(tb testing.TB) { Check(tb, dir, got, "input.yaml") }); len(r.errors) != 0 {
		t.Errorf("Check after -update: %q", r.errors)
	}
}

func TestCases(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []string{"b-case", "a-case"} {
		if err := os.Mkdir(filepath.Join(dir, c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if r := run(t, func(tb testing.TB) {
		if got := Cases(tb, dir); !slices.Equal(got, []string{"a-case", "b-case"}) {
			t.Errorf("Cases = %q", got)
		}
	}); len(r.errors) != 0 {
		t.Errorf("failures %q", r.errors)
	}
	writeFiles(t, dir, map[string]string{"stray.yaml": ""})
	if r := run(t, func(tb testing.TB) { Cases(tb, dir) }); len(r.errors) != 1 || !strings.Contains(r.errors[0], "stray.yaml: only case directories belong in") {
		t.Errorf("a stray file: failures %q", r.errors)
	}
	if r := run(t, func(tb testing.TB) { Cases(tb, t.TempDir()) }); !r.fatal || !strings.Contains(r.errors[0], "no golden cases") {
		t.Errorf("no cases: failures %q", r.errors)
	}
}
