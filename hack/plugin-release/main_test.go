package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/guestbackup/guestbackup/internal/golden"
)

func TestManifest(t *testing.T) {
	sums := map[platform]string{}
	for i, p := range platforms {
		sums[p] = hex.EncodeToString([]byte{byte(i)})
	}
	golden.Check(t, "testdata", map[string][]byte{
		"guestbackup.yaml": manifest("v0.4.0", "https://example.com/releases/v0.4.0", sums),
	})
}

func TestPack(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "built")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho plugin\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "a.tar.gz")
	sum, err := pack(archive, bin, "kubectl-guestbackup", []byte("license text"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
		t.Errorf("pack returned %s, the archive's SHA-256 is %x", sum, got)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	got := map[string]int64{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h.Mode
	}
	if got["kubectl-guestbackup"] != 0o755 || got["LICENSE"] != 0o644 || len(got) != 2 {
		t.Errorf("archive holds %v: want the executable kubectl-guestbackup and LICENSE", got)
	}
}

func TestRunRefusesWhatKrewRefuses(t *testing.T) {
	for _, tt := range []struct{ version, url string }{{"0.4.0", "https://example.com"}, {"v0.4", "https://example.com"}, {"v0.4.0", "http://example.com"}} {
		if err := run(tt.version, tt.url, t.TempDir()); err == nil {
			t.Errorf("run(%q, %q) succeeded; want an error before building anything", tt.version, tt.url)
		}
	}
}
