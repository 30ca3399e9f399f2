package serverpod_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/serverargs"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/integrity"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
)

// TestFlagDefaultsAreTheServers: the defaults serverargs declares for the
// flags, which it cannot take from Kopia or package integrity itself, are
// theirs.
func TestFlagDefaultsAreTheServers(t *testing.T) {
	kopia := maintenance.DefaultSchedule()
	for _, tc := range []struct {
		flag      string
		got, want any
	}{
		{"init --maintenance-quick-interval", serverargs.NewInit().MaintenanceQuickInterval, kopia.Quick},
		{"init --maintenance-full-interval", serverargs.NewInit().MaintenanceFullInterval, kopia.Full},
		{"sync-users --verify-interval", serverargs.NewSyncUsers().VerifyInterval, time.Duration(integrity.DefaultInterval)},
		{"sync-users --verify-read-bytes", serverargs.NewSyncUsers().VerifyReadBytes, int64(integrity.DefaultReadBytesPerPass)},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: default %v, the server's is %v", tc.flag, tc.got, tc.want)
		}
	}
}

// TestInitOptionsFrom: what init does for each command line.
func TestInitOptionsFrom(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, []byte("a CA bundle"), 0o600); err != nil {
		t.Fatal(err)
	}
	files := serverpod.PrepareOptions{ConfigFile: "/config/repository.config", TLSCertFile: "/tls/tls.crt", TLSCAFile: "/tls/ca.crt", ChainFile: "/config/tls-chain.pem"}
	args := func(set func(*serverargs.Init)) serverargs.Init {
		a := serverargs.NewInit()
		a.ConfigFile, a.TLSCertFile, a.TLSCAFile, a.ChainFile = files.ConfigFile, files.TLSCertFile, files.TLSCAFile, files.ChainFile
		set(&a)
		return a
	}
	withStorage := func(s serverpod.Storage) serverpod.PrepareOptions { p := files; p.Storage = s; return p }
	for _, tc := range []struct {
		name    string
		args    serverargs.Init
		want    serverpod.InitOptions
		wantErr string
	}{
		{
			name: "filesystem, append-only, maintenance on Kopia's schedule",
			args: args(func(a *serverargs.Init) {
				a.FilesystemPath, a.AppendOnly, a.Maintenance, a.Namespace, a.BSLS = "/repository", true, true, "backup", "main"
			}),
			want: serverpod.InitOptions{
				PrepareOptions: withStorage(serverpod.Storage{Filesystem: &serverpod.FilesystemLocation{Path: "/repository"}}),
				AppendOnly:     true,
				Maintenance:    &serverpod.MaintenanceOptions{Namespace: "backup", BSLS: "main", Schedule: maintenance.DefaultSchedule()},
			},
		},
		{
			name: "S3 with a private CA, its keys in the environment, a default policy",
			args: args(func(a *serverargs.Init) {
				a.S3Bucket, a.S3Prefix, a.S3Endpoint, a.S3Region, a.S3DisableTLS, a.S3CAFile = "b", "p/", "s3:9000", "eu", true, caFile
				a.DefaultPolicy = `{"compression":"zstd"}`
			}),
			want: serverpod.InitOptions{PrepareOptions: func() serverpod.PrepareOptions {
				p := withStorage(serverpod.Storage{S3: &serverpod.S3Location{Bucket: "b", Prefix: "p/", Endpoint: "s3:9000", Region: "eu", DisableTLS: true, CABundle: []byte("a CA bundle")}})
				p.Defaults = &v1alpha1.PolicySpec{Compression: "zstd"}
				return p
			}()},
		},
		{
			name: "GCS through a Velero Secret",
			args: args(func(a *serverargs.Init) {
				a.GCSBucket, a.GCSPrefix, a.CredentialsSecret = "g", "gp/", "velero/cloud-credentials"
			}),
			want: serverpod.InitOptions{
				PrepareOptions: withStorage(serverpod.Storage{GCS: &serverpod.GCSLocation{Bucket: "g", Prefix: "gp/"}}),
				Velero:         &serverpod.VeleroCredentials{Namespace: "velero", Name: "cloud-credentials", Key: "cloud", Profile: "default"},
			},
		},
		{
			name: "Azure as the pod's cloud identity",
			args: args(func(a *serverargs.Init) {
				a.AzureContainer, a.AzureStorageAccount, a.AzurePrefix, a.AzureStorageDomain, a.AzureDisableTLS = "c", "acct", "ap/", "example", true
				a.WorkloadIdentity = true
			}),
			want: serverpod.InitOptions{
				PrepareOptions:   withStorage(serverpod.Storage{Azure: &serverpod.AzureLocation{Container: "c", StorageAccount: "acct", Prefix: "ap/", StorageDomain: "example", DisableTLS: true}}),
				WorkloadIdentity: true,
			},
		},
		{
			name:    "maintenance without its owner",
			args:    args(func(a *serverargs.Init) { a.FilesystemPath, a.Maintenance = "/repository", true }),
			wantErr: "--maintenance needs --namespace and --bsls",
		},
		{
			name:    "no storage",
			args:    args(func(*serverargs.Init) {}),
			wantErr: "set exactly one of",
		},
		{
			name:    "two storages",
			args:    args(func(a *serverargs.Init) { a.FilesystemPath, a.GCSBucket = "/repository", "g" }),
			wantErr: "set exactly one of",
		},
		{
			name:    "a credential Secret without its namespace",
			args:    args(func(a *serverargs.Init) { a.GCSBucket, a.CredentialsSecret = "g", "cloud-credentials" }),
			wantErr: `--credentials-secret "cloud-credentials": want <namespace>/<name>`,
		},
		{
			name:    "a default policy that is not JSON",
			args:    args(func(a *serverargs.Init) { a.FilesystemPath, a.DefaultPolicy = "/repository", "{" }),
			wantErr: "--default-policy",
		},
		{
			name:    "an S3 CA bundle that is not there",
			args:    args(func(a *serverargs.Init) { a.S3Bucket, a.S3CAFile = "b", filepath.Join(t.TempDir(), "none") }),
			wantErr: "read S3 CA bundle",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := serverpod.InitOptionsFrom(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
