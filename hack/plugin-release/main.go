// Command plugin-release builds the kubectl plugin `kubectl guestbackup`
// for every platform krew installs it on, packs each as the archive krew
// downloads, and writes the krew plugin manifest that names them with
// their SHA-256:
//
//	plugin-release -version v0.4.0 -url-base https://example.com/releases/v0.4.0 -out bin/plugin
//
// Upload the archives under -url-base, then submit guestbackup.yaml to a
// krew index (or install it directly: kubectl krew install --manifest=...).
package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// platform is one OS and architecture krew selects an archive by.
type platform struct{ OS, Arch string }

// platforms are those the plugin is released for: it is pure Go.
var platforms = []platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}, {"windows", "amd64"}}

// binary is the plugin's file name on p, as kubectl finds plugins.
func (p platform) binary() string {
	if p.OS == "windows" {
		return "kubectl-guestbackup.exe"
	}
	return "kubectl-guestbackup"
}

// archive is the file name of p's archive.
func (p platform) archive() string {
	return fmt.Sprintf("kubectl-guestbackup_%s_%s.tar.gz", p.OS, p.Arch)
}

func main() {
	version := flag.String("version", "", "The release's version, vMAJOR.MINOR.PATCH (krew requires it).")
	urlBase := flag.String("url-base", "", "The https:// URL the archives are uploaded under.")
	out := flag.String("out", "bin/plugin", "Folder the archives and guestbackup.yaml are written to.")
	flag.Parse()
	if err := run(*version, *urlBase, *out); err != nil {
		fmt.Fprintln(os.Stderr, "plugin-release:", err)
		os.Exit(1)
	}
}

var semver = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)

func run(version, urlBase, out string) error {
	if !semver.MatchString(version) {
		return fmt.Errorf("-version %q: want vMAJOR.MINOR.PATCH, as krew requires", version)
	}
	if !strings.HasPrefix(urlBase, "https://") {
		return fmt.Errorf("-url-base %q: want an https:// URL", urlBase)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	license, err := os.ReadFile("LICENSE")
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	sums := map[platform]string{}
	for _, p := range platforms {
		bin := filepath.Join(out, p.OS+"-"+p.Arch, p.binary())
		build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/kubectl-guestbackup")
		build.Env = append(os.Environ(), "GOOS="+p.OS, "GOARCH="+p.Arch, "CGO_ENABLED=0")
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build for %s/%s: %w", p.OS, p.Arch, err)
		}
		sum, err := pack(filepath.Join(out, p.archive()), bin, p.binary(), license)
		if err != nil {
			return fmt.Errorf("pack for %s/%s: %w", p.OS, p.Arch, err)
		}
		sums[p] = sum
	}
	return os.WriteFile(filepath.Join(out, "guestbackup.yaml"), manifest(version, strings.TrimSuffix(urlBase, "/"), sums), 0o644)
}

// archived is one file of an archive.
type archived struct {
	name string
	mode int64
	data []byte
}

// pack writes the archive krew downloads: the binary under name (and the
// license, when there is one), gzipped tar. It returns the archive's
// SHA-256, which the manifest pins.
func pack(archive, bin, name string, license []byte) (string, error) {
	f, err := os.Create(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	gz := gzip.NewWriter(io.MultiWriter(f, h))
	tw := tar.NewWriter(gz)
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	files := []archived{{name, 0o755, data}}
	if license != nil {
		files = append(files, archived{"LICENSE", 0o644, license})
	}
	for _, file := range files {
		if err := tw.WriteHeader(&tar.Header{Name: file.name, Mode: file.mode, Size: int64(len(file.data)), Typeflag: tar.TypeReg}); err != nil {
			return "", err
		}
		if _, err := tw.Write(file.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), f.Close()
}

// manifest is krew's plugin manifest for the archives of sums, uploaded
// under urlBase.
func manifest(version, urlBase string, sums map[platform]string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: guestbackup
spec:
  version: %s
  homepage: https://github.com/guestbackup/guestbackup
  shortDescription: See how guestbackup backs up your VirtualMachines
  description: |
    Shows, from the cluster, how guestbackup backs up the KubeVirt
    VirtualMachines of a namespace: each VM's snapshots, its newest backup,
    and whether its guest connects (status), and lists a VM's newest
    snapshots, to restore from (snapshots). It reads the GuestProtection
    guestbackup keeps for every VM that opts in, so the namespace's view
    role is enough. Exit codes tell a script whether every VM is protected.
    With the edit role, it backs a VM up now (backup), restores files
    and folders of its snapshots into its guest or a PersistentVolumeClaim
    (restore), and lists a file's versions across its snapshots (history),
    each done under the VM's own identity.
  caveats: |
    guestbackup must be installed in the cluster (its chart); backup and
    restore need its requests enabled. Try:
      kubectl guestbackup status --help
      kubectl guestbackup snapshots --help
      kubectl guestbackup restore --help
      kubectl guestbackup history --help
  platforms:
`, version)
	for _, p := range platforms {
		sum, ok := sums[p]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, `  - selector:
      matchLabels:
        os: %s
        arch: %s
    uri: %s/%s
    sha256: %s
    bin: %s
`, p.OS, p.Arch, urlBase, p.archive(), sum, p.binary())
	}
	return []byte(b.String())
}
