package serverpod

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/storagecreds"
)

// TestTakeForeignACLs: what init removed is reported by user sync once,
// and a container that starts without init's note has nothing to report.
func TestTakeForeignACLs(t *testing.T) {
	config := filepath.Join(t.TempDir(), "repository.config")
	if got, err := TakeForeignACLs(config); err != nil || got != nil {
		t.Fatalf("without a note: %v, %v", got, err)
	}
	want := []kopiauser.ForeignACL{{ID: "m1", Raw: "not an ACL"}}
	data, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(foreignACLsFile(config), data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := TakeForeignACLs(config)
	if err != nil || len(got) != 1 || got[0].ID != "m1" || got[0].Raw != "not an ACL" {
		t.Fatalf("TakeForeignACLs = %+v, %v", got, err)
	}
	if again, err := TakeForeignACLs(config); err != nil || again != nil {
		t.Errorf("reported twice: %v, %v", again, err)
	}
	if err := os.WriteFile(foreignACLsFile(config), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := TakeForeignACLs(config); err == nil {
		t.Error("a corrupt note was accepted")
	}
}

// TestS3CredentialsFromEnv: init refuses S3 storage without credentials,
// naming the variables to set, rather than trying anonymous access.
func TestS3CredentialsFromEnv(t *testing.T) {
	t.Setenv(storagecreds.AccessKeyID, "AKIA")
	t.Setenv(storagecreds.SecretAccessKey, "")
	var s S3Location
	if err := s.readEnv(); err == nil || !strings.Contains(err.Error(), storagecreds.SecretAccessKey) {
		t.Errorf("without a secret key: %v", err)
	}
	t.Setenv(storagecreds.SecretAccessKey, "secret")
	t.Setenv(storagecreds.SessionToken, "token")
	if err := s.readEnv(); err != nil || s.AccessKeyID != "AKIA" || s.SecretAccessKey != "secret" || s.SessionToken != "token" {
		t.Errorf("readEnv = %+v, %v", s, err)
	}
}

func TestParsePolicy(t *testing.T) {
	if p, err := ParsePolicy(""); p != nil || err != nil {
		t.Errorf(`ParsePolicy("") = %v, %v`, p, err)
	}
	if p, err := ParsePolicy(`{"compression":"zstd"}`); err != nil || p.Compression != "zstd" {
		t.Errorf("ParsePolicy = %+v, %v", p, err)
	}
	if _, err := ParsePolicy("{"); err == nil {
		t.Error("malformed JSON was accepted")
	}
}
