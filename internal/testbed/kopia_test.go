package testbed

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/pkg/pki"
)

// TestKopiaServerWithTrustingClient is the test bed's promise about Kopia: a
// real server presenting leaf + CA on loopback, and a real client that
// trusts it only through the CA it was given and its own password.
func TestKopiaServerWithTrustingClient(t *testing.T) {
	ctx := context.Background()
	server := StartKopiaServer(t, KopiaServerOptions{})
	const user = "vm-a@ns-a"
	password := RandomPassword()
	server.AddUser(t, user, password)

	t.Run("the CA and the user's password connect", func(t *testing.T) {
		client := NewKopiaClient(t)
		if out, err := client.Connect(ctx, server.URL, server.CA.CertPEM(), user, password); err != nil {
			t.Fatalf("connect: %v\n%s", err, out)
		}
		data := filepath.Join(t.TempDir(), "data")
		if err := os.MkdirAll(data, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data, "hello.txt"), []byte("hello from the guest\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := client.Run(ctx, "snapshot", "create", data); err != nil {
			t.Fatalf("snapshot create: %v\n%s", err, out)
		}
		out, err := client.Run(ctx, "snapshot", "list", "--json", data)
		if err != nil {
			t.Fatalf("snapshot list: %v\n%s", err, out)
		}
		var snapshots []struct {
			Source struct {
				Host     string `json:"host"`
				UserName string `json:"userName"`
			} `json:"source"`
			Stats struct {
				FileCount int `json:"fileCount"`
			} `json:"stats"`
		}
		if err := json.Unmarshal([]byte(out), &snapshots); err != nil {
			t.Fatalf("snapshot list is not JSON: %v\n%s", err, out)
		}
		if len(snapshots) != 1 || snapshots[0].Source.UserName+"@"+snapshots[0].Source.Host != user || snapshots[0].Stats.FileCount != 1 {
			t.Fatalf("want one snapshot of one file by %s, got:\n%s", user, out)
		}
	})

	t.Run("a client trusting another CA refuses the server", func(t *testing.T) {
		other, err := pki.NewCA("another CA", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		out, err := NewKopiaClient(t).Connect(ctx, server.URL, other.CertPEM(), user, password)
		if err == nil {
			t.Fatalf("connect trusting a foreign CA succeeded:\n%s", out)
		}
		if !strings.Contains(out, "certificate signed by unknown authority") {
			t.Fatalf("refusal does not say the server's certificate is not trusted:\n%s", out)
		}
	})

	t.Run("the host's own CAs are not trusted", func(t *testing.T) {
		// A client given no CA of the server's: Go must not fall back on
		// the host's trust store, or any public CA would do.
		out, err := NewKopiaClient(t).Connect(ctx, server.URL, nil, user, password)
		if err == nil || !strings.Contains(out, "certificate signed by unknown authority") {
			t.Fatalf("connect with an empty trust: %v\n%s", err, out)
		}
	})

	t.Run("a wrong password is refused", func(t *testing.T) {
		out, err := NewKopiaClient(t).Connect(ctx, server.URL, server.CA.CertPEM(), user, RandomPassword())
		if err == nil {
			t.Fatalf("connect with a wrong password succeeded:\n%s", out)
		}
		if !strings.Contains(out, "access denied") && !strings.Contains(out, "Unauthenticated") {
			t.Fatalf("refusal does not say the credentials were denied:\n%s", out)
		}
	})

	t.Run("a second server on the same repository knows the user", func(t *testing.T) {
		second := StartKopiaServer(t, KopiaServerOptions{
			RepoPath: server.RepoPath, RepoPassword: server.RepoPassword, CA: server.CA,
		})
		if second.CAPin != server.CAPin {
			t.Fatalf("servers sharing a CA have different pins")
		}
		if out, err := NewKopiaClient(t).Connect(ctx, second.URL, second.CA.CertPEM(), user, password); err != nil {
			t.Fatalf("connect to the second server: %v\n%s", err, out)
		}
	})

	t.Run("a deleted user is refused at once", func(t *testing.T) {
		if err := server.SetUsers(ctx, nil, user); err != nil {
			t.Fatal(err)
		}
		out, err := NewKopiaClient(t).Connect(ctx, server.URL, server.CA.CertPEM(), user, password)
		if err == nil {
			t.Fatalf("a deleted user connected:\n%s", out)
		}
	})
}
