// Package image proves that `make image` builds guestbackup's image
// without a container engine, as an OCI layout tarball whose binaries run.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// ociFile reads one file of the layout tarball.
func ociFile(t *testing.T, archive []byte, name string) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("no %s in the image tarball", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Annotations map[string]string `json:"annotations"`
}

func blob(t *testing.T, archive []byte, d descriptor) []byte {
	t.Helper()
	return ociFile(t, archive, "blobs/"+strings.Replace(d.Digest, ":", "/", 1))
}

func TestMakeImageBuildsARunnableOCIImage(t *testing.T) {
	testbed.RequireTestBed(t)
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "guestbackup.tar")
	if log, err := testbed.Run(context.Background(), 20*time.Minute, root, []string{"HOME=" + os.Getenv("HOME"), "GOPATH=" + os.Getenv("GOPATH"), "GOCACHE=" + os.Getenv("GOCACHE"), "GOMODCACHE=" + os.Getenv("GOMODCACHE"), "GUESTBACKUP_CACHE=" + os.Getenv("GUESTBACKUP_CACHE")}, filepath.Join(root, "hack", "image.sh"), out); err != nil {
		t.Fatalf("hack/image.sh (make image): %v\n%s", err, log)
	}
	archive, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}

	var index struct{ Manifests []descriptor }
	if err := json.Unmarshal(ociFile(t, archive, "index.json"), &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %+v", err, index)
	}
	if got := index.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != "guestbackup:dev" {
		t.Errorf("image name %q", got)
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	if err := json.Unmarshal(blob(t, archive, index.Manifests[0]), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v, %+v", err, manifest)
	}
	var config struct {
		OS, Architecture string
		Config           struct {
			User       string
			Entrypoint []string
		}
	}
	if err := json.Unmarshal(blob(t, archive, manifest.Config), &config); err != nil {
		t.Fatal(err)
	}
	if config.OS != "linux" || config.Config.User != "65532:65532" || strings.Join(config.Config.Entrypoint, " ") != "/usr/local/bin/controller" {
		t.Errorf("config: %+v", config)
	}

	// Every entrypoint of the image runs (static: no libc needed).
	zr, err := gzip.NewReader(bytes.NewReader(blob(t, archive, manifest.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	tr := tar.NewReader(zr)
	found := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(h.Name, "usr/local/bin/") || h.Typeflag != tar.TypeReg {
			continue
		}
		if h.Mode&0o111 == 0 {
			t.Errorf("%s is not executable", h.Name)
		}
		name := filepath.Join(bin, filepath.Base(h.Name))
		f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		f.Close()
		found[filepath.Base(h.Name)] = true
	}
	for _, cmd := range []string{"controller", "webhook", "guestbackup-server", "guestbackup-restore", "kopia"} {
		if !found[cmd] {
			t.Errorf("the image has no /usr/local/bin/%s", cmd)
			continue
		}
		if out, err := testbed.Run(context.Background(), time.Minute, bin, nil, filepath.Join(bin, cmd), "--help"); err != nil {
			t.Errorf("%s --help: %v\n%s", cmd, err, out)
		}
	}
}
