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

// TestWorkloadIdentityCredentials: with --workload-identity the pod gets
// no static key; S3 and GCS leave Kopia to find the pod's identity, Azure
// takes the federated token its webhook announced, or says what is
// missing; GCS and Azure without any credential source are refused.
func TestWorkloadIdentityCredentials(t *testing.T) {
	t.Setenv(storagecreds.AccessKeyID, "AKIA-from-a-stale-variable")
	for _, st := range []Storage{{S3: &S3Location{Bucket: "b"}}, {GCS: &GCSLocation{Bucket: "b"}}} {
		o := InitOptions{PrepareOptions: PrepareOptions{Storage: st}, WorkloadIdentity: true}
		if err := o.credentials(t.Context()); err != nil {
			t.Errorf("%+v: %v", st, err)
		}
		if st.S3 != nil && st.S3.AccessKeyID != "" {
			t.Errorf("S3 under workload identity took the static key %q", st.S3.AccessKeyID)
		}
		if st.GCS != nil && st.GCS.CredentialsJSON != nil {
			t.Errorf("GCS under workload identity has a key")
		}
	}

	az := &AzureLocation{Container: "c", StorageAccount: "a"}
	o := InitOptions{PrepareOptions: PrepareOptions{Storage: Storage{Azure: az}}, WorkloadIdentity: true}
	err := o.credentials(t.Context())
	if err == nil || !strings.Contains(err.Error(), storagecreds.AzureFederatedTokenFile) || !strings.Contains(err.Error(), "azure.workload.identity/use=true") {
		t.Errorf("Azure without its webhook's variables: %v", err)
	}
	t.Setenv(storagecreds.AzureTenantID, "tenant")
	t.Setenv(storagecreds.AzureClientID, "client")
	t.Setenv(storagecreds.AzureFederatedTokenFile, "/var/run/secrets/azure/tokens/azure-identity-token")
	if err := o.credentials(t.Context()); err != nil {
		t.Fatal(err)
	}
	if want := (AzureLocation{Container: "c", StorageAccount: "a", TenantID: "tenant", ClientID: "client", FederatedTokenFile: "/var/run/secrets/azure/tokens/azure-identity-token"}); *az != want {
		t.Errorf("Azure under workload identity = %+v, want %+v", *az, want)
	}

	for _, st := range []Storage{{GCS: &GCSLocation{Bucket: "b"}}, {Azure: &AzureLocation{Container: "c"}}} {
		o := InitOptions{PrepareOptions: PrepareOptions{Storage: st}}
		if err := o.credentials(t.Context()); err == nil || !strings.Contains(err.Error(), "--workload-identity") {
			t.Errorf("%+v with no credential source: %v", st, err)
		}
	}
}
