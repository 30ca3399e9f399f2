package deps

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// outsideNames are what a file cites when it points out of the
// repository: the team's own design and test bed notes and the folder
// beside the checkout they live in. A reader of the repository has none of
// them, so every rule the code relies on is stated in docs/ (docs/design.md
// for the design decisions, by number) or in the code's own comments. Each
// name is written in two pieces so that this file does not cite it.
var outsideNames = []string{
	"DESIGN" + ".md",
	"TESTBED" + ".md",
	"../" + "shared",
	"seeds" + "/",
}

// outsideReferences returns each line of content, numbered from 1, that
// names something outside the repository, with the name it cites.
func outsideReferences(content []byte) []string {
	var found []string
	for i, line := range bytes.Split(content, []byte("\n")) {
		for _, name := range outsideNames {
			if bytes.Contains(line, []byte(name)) {
				found = append(found, fmt.Sprintf("%d: %s", i+1, name))
			}
		}
	}
	return found
}

// binary says whether content is not text, by git's own rule: a NUL byte
// in its first 8,000 bytes.
func binary(content []byte) bool {
	return bytes.IndexByte(content[:min(len(content), 8000)], 0) >= 0
}

func TestOutsideReferences(t *testing.T) {
	design, testbed, shared, seeds := outsideNames[0], outsideNames[1], outsideNames[2], outsideNames[3]
	for _, tt := range []struct {
		name    string
		content string
		want    []string
	}{
		{name: "nothing outside", content: "// Identity comes from facts (docs/design.md, decision 10).\n"},
		{name: "the design notes", content: "a\n// Identity comes from facts (" + design + " decision 10).\n", want: []string{"2: " + design}},
		{name: "the test bed notes", content: "v1.8.1 or v1.7.0: see " + testbed + "\n", want: []string{"1: " + testbed}},
		{name: "the folder beside the checkout", content: "x\ny\nsee " + shared + "/notes\n", want: []string{"3: " + shared}},
		{name: "the design seeds", content: "the original designs are in " + seeds + " beside it\n", want: []string{"1: " + seeds}},
		{name: "two on one line", content: design + " and " + seeds + "\n", want: []string{"1: " + design, "1: " + seeds}},
		{name: "a doc of the repository, in lower case", content: "[design](design.md), decision 27\n"},
		{name: "seeds that are no folder", content: "# seeds come from a NoCloud ISO\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := outsideReferences([]byte(tt.content)); !slices.Equal(got, tt.want) {
				t.Errorf("outsideReferences(%q) = %q, want %q", tt.content, got, tt.want)
			}
		})
	}
}

func TestBinary(t *testing.T) {
	for _, tt := range []struct {
		name    string
		content []byte
		want    bool
	}{
		{name: "empty", content: nil},
		{name: "text", content: []byte("package deps\n")},
		{name: "a NUL byte", content: []byte("\x7fELF\x02\x01\x01\x00"), want: true},
		{name: "a NUL byte past the first 8,000", content: append(bytes.Repeat([]byte("a"), 8000), 0)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := binary(tt.content); got != tt.want {
				t.Errorf("binary = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestNothingCitesFilesOutsideTheRepository: no tracked text file names a
// file a reader of the repository does not have.
func TestNothingCitesFilesOutsideTheRepository(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s (this check reads the tracked files of a checkout): %v", root, err)
	}
	dirs := map[string]bool{}
	for name := range strings.SplitSeq(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		// go test caches a pass on the files it opened: reading each
		// folder too makes a file added since a new input.
		dirs[filepath.Dir(name)] = true
		if filepath.Base(name) == "go.sum" {
			continue
		}
		content, err := os.ReadFile(filepath.Join(root, name))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		if binary(content) {
			continue
		}
		for _, f := range outsideReferences(content) {
			t.Errorf("%s:%s names a file outside the repository: cite docs/ (docs/design.md, decision N, for a design decision) or state the rule where it is used", name, f)
		}
	}
	for dir := range dirs {
		if _, err := os.ReadDir(filepath.Join(root, dir)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
}
