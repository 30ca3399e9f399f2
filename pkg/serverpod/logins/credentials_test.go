package logins

import (
	"crypto/sha1" //nolint:gosec // the scheme under test
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A credential is the same for a user within a process, and differs
// between users and between processes.
func TestCredentialFor(t *testing.T) {
	a, b := NewCredentials(), NewCredentials()
	if a.For("db@team-a") != a.For("db@team-a") {
		t.Error("one user's credential changed within a process")
	}
	if a.For("db@team-a") == a.For("web@team-a") {
		t.Error("two users share a credential")
	}
	if a.For("db@team-a") == b.For("db@team-a") {
		t.Error("two processes share a credential")
	}
	if n := len(a.For("db@team-a")); n != 43 {
		t.Errorf("a credential of %d characters, want 43 (256 bits)", n)
	}
}

// The file holds one {SHA} line per user, in name order, of its
// credential, after CheckUser's of its generation: what Kopia's htpasswd
// authenticator reads.
func TestHtpasswd(t *testing.T) {
	c := NewCredentials()
	lines := strings.Split(strings.TrimSuffix(string(c.Htpasswd([]string{"web@team-a", "db@team-a"}, 7)), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %q", len(lines), lines)
	}
	for i, want := range [][2]string{{CheckUser, c.Check(7)}, {"db@team-a", c.For("db@team-a")}, {"web@team-a", c.For("web@team-a")}} {
		sum := sha1.Sum([]byte(want[1])) //nolint:gosec // the scheme under test
		if line := want[0] + ":{SHA}" + base64.StdEncoding.EncodeToString(sum[:]); lines[i] != line {
			t.Errorf("line %d: %q, want %q", i, lines[i], line)
		}
	}
	if got := strings.Count(string(c.Htpasswd(nil, 7)), "\n"); got != 1 {
		t.Errorf("no users: %d lines, want CheckUser's alone", got)
	}
	if c.Check(7) == c.Check(8) || c.Check(8) == c.For(CheckUser) {
		t.Error("CheckUser's credential is the same in two files: a login as it would not tell which file the server loaded")
	}
}

func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "htpasswd")
	for _, content := range []string{"a:{SHA}x\n", ""} {
		if err := WriteFile(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read %q, %v; want %q", got, err, content)
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("%d files left in the folder, want the file alone", len(entries))
	}
}
