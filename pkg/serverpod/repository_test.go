package serverpod_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
)

// globalPolicy reads the repository's global policy with the real kopia CLI.
func globalPolicy(t *testing.T, configFile, password string) (keepLatest int, compressor string) {
	t.Helper()
	tools := testbed.MustTools(t)
	out, err := testbed.Run(context.Background(), time.Minute, t.TempDir(), []string{"KOPIA_PASSWORD=" + password, "KOPIA_CHECK_FOR_UPDATES=false"},
		tools.Kopia, "policy", "show", "--global", "--json", "--config-file="+configFile)
	if err != nil {
		t.Fatalf("kopia policy show: %v\n%s", err, out)
	}
	var p struct {
		Retention struct {
			KeepLatest int `json:"keepLatest"`
		} `json:"retention"`
		Compression struct {
			Compressor string `json:"compressorName"`
		} `json:"compression"`
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("policy is not JSON: %v\n%s", err, out)
	}
	return p.Retention.KeepLatest, p.Compression.Compressor
}

func TestConnectOrCreate(t *testing.T) {
	ctx := context.Background()
	storage := serverpod.Storage{Filesystem: &serverpod.FilesystemLocation{Path: filepath.Join(t.TempDir(), "repository")}}
	const password = "repository password"
	defaults := &v1alpha1.PolicySpec{
		Retention:   &v1alpha1.RetentionPolicy{KeepLatest: ptr.To[int32](3)},
		Compression: "zstd",
	}

	first := filepath.Join(t.TempDir(), "repository.config")
	created, err := serverpod.ConnectOrCreate(ctx, storage, first, password, defaults)
	if err != nil || !created {
		t.Fatalf("first ConnectOrCreate = %v, %v; want a new repository", created, err)
	}
	if keep, comp := globalPolicy(t, first, password); keep != 3 || comp != "zstd" {
		t.Fatalf("global policy keeps %d latest with %q; want 3 with zstd", keep, comp)
	}

	// A restarted pod connects; the repository's policy is the admin's to change, not ours.
	second := filepath.Join(t.TempDir(), "repository.config")
	created, err = serverpod.ConnectOrCreate(ctx, storage, second, password, &v1alpha1.PolicySpec{Compression: "s2-default"})
	if err != nil || created {
		t.Fatalf("second ConnectOrCreate = %v, %v; want a connection to the existing repository", created, err)
	}
	if keep, comp := globalPolicy(t, second, password); keep != 3 || comp != "zstd" {
		t.Fatalf("reconnecting changed the policy: keeps %d latest with %q", keep, comp)
	}

	_, err = serverpod.ConnectOrCreate(ctx, storage, filepath.Join(t.TempDir(), "c"), "wrong password", nil)
	if err == nil || !strings.Contains(err.Error(), "invalid repository password") {
		t.Fatalf("wrong password: error = %v, want one saying the password is invalid", err)
	}
}

func TestConnectOrCreateWithoutDefaults(t *testing.T) {
	storage := serverpod.Storage{Filesystem: &serverpod.FilesystemLocation{Path: filepath.Join(t.TempDir(), "repository")}}
	config := filepath.Join(t.TempDir(), "repository.config")
	if _, err := serverpod.ConnectOrCreate(context.Background(), storage, config, "pw", nil); err != nil {
		t.Fatal(err)
	}
	// Kopia's own defaults, as `kopia repository create` sets them.
	if keep, _ := globalPolicy(t, config, "pw"); keep != 10 {
		t.Fatalf("global policy keeps %d latest, want Kopia's default 10", keep)
	}
}

func TestStorageNeedsExactlyOneKind(t *testing.T) {
	for name, s := range map[string]serverpod.Storage{
		"none": {},
		"both": {Filesystem: &serverpod.FilesystemLocation{Path: t.TempDir()}, S3: &serverpod.S3Location{Bucket: "b"}},
	} {
		if _, err := serverpod.ConnectOrCreate(context.Background(), s, filepath.Join(t.TempDir(), "c"), "pw", nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
