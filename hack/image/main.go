// Command image writes guestbackup's container image as an OCI image
// layout tarball, from binaries already built, without a container engine:
//
//	go run . -out guestbackup.tar -tag guestbackup:dev \
//	    -file /usr/local/bin/controller=../../bin/image/controller ... \
//	    -entrypoint /usr/local/bin/controller
//
// guestbackup's image is one layer on an empty base: the static binaries, and
// the CA bundle that kopia needs to reach S3 over TLS. It runs as a non-root
// numeric user and fixes no other UID, so OpenShift may assign its own.
//
// The cluster backend's KubeVirt images (hack/kubevirt-images.sh) start from
// prebuilt tar layers (-layer): a Debian root made by debootstrap, and
// KubeVirt's binaries with the file capabilities KubeVirt's own images give
// them, which only a tar written with --xattrs carries. -env replaces the
// default environment.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// files maps a path in the image to a file on this machine.
type files map[string]string

func (f files) String() string { return fmt.Sprint(map[string]string(f)) }

func (f files) Set(v string) error {
	dst, src, ok := strings.Cut(v, "=")
	if !ok || !strings.HasPrefix(dst, "/") || src == "" {
		return fmt.Errorf("%q: want /path/in/image=local/file", v)
	}
	f[dst] = src
	return nil
}

// list is a repeatable flag of values in order.
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }

func (l *list) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// defaultEnv is guestbackup's image's environment.
var defaultEnv = []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", "HOME=/tmp"}

func main() {
	fs := files{}
	var layers, env list
	out := flag.String("out", "", "Where to write the OCI image layout tarball.")
	tag := flag.String("tag", "guestbackup:dev", "The image's name in the layout's index (org.opencontainers.image.ref.name).")
	entrypoint := flag.String("entrypoint", "/usr/local/bin/controller", "The image's entrypoint.")
	user := flag.String("user", "65532:65532", "The numeric user the image runs as.")
	flag.Var(fs, "file", "A file of the image, /path/in/image=local/file; repeatable. Files under a bin/ folder are executable.")
	flag.Var(&layers, "layer", "A tar file to add as a layer before the -file layer, as it is (ownership, modes, xattrs); repeatable, in order.")
	flag.Var(&env, "env", "An environment variable of the image, NAME=value; repeatable. When given, replaces the default environment.")
	flag.Parse()
	if len(env) == 0 {
		env = defaultEnv
	}
	if err := run(*out, *tag, *entrypoint, *user, layers, env, fs); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(out, tag, entrypoint, user string, layerFiles, env []string, fs files) error {
	if out == "" || len(fs)+len(layerFiles) == 0 {
		return fmt.Errorf("-out and at least one -file or -layer are required")
	}
	var layers []v1.Layer
	for _, f := range layerFiles {
		// Fastest gzip: the images only travel to the node's containerd.
		layer, err := tarball.LayerFromFile(f, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return fmt.Errorf("layer %s: %w", f, err)
		}
		layers = append(layers, layer)
	}
	if len(fs) > 0 {
		layerTar, err := layerOf(fs)
		if err != nil {
			return err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
		layers = append(layers, layer)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layers...)
	if err != nil {
		return fmt.Errorf("append layers: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Entrypoint = []string{entrypoint}
	cfg.Config.User = user
	cfg.Config.Env = env
	cfg.Config.Labels = map[string]string{"org.opencontainers.image.source": "https://github.com/guestbackup/guestbackup"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "guestbackup-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	return tarDir(dir, out)
}

// layerOf is the one layer: every file, its parent folders, and /tmp.
func layerOf(fs files) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{"/tmp": true}
	for dst := range fs {
		for d := filepath.Dir(dst); d != "/"; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	sortedDirs := make([]string, 0, len(dirs))
	for d := range dirs {
		sortedDirs = append(sortedDirs, d)
	}
	sort.Strings(sortedDirs)
	for _, d := range sortedDirs {
		mode := int64(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	dsts := make([]string, 0, len(fs))
	for dst := range fs {
		dsts = append(dsts, dst)
	}
	sort.Strings(dsts)
	for _, dst := range dsts {
		data, err := os.ReadFile(fs[dst])
		if err != nil {
			return nil, err
		}
		mode := int64(0o644)
		if strings.Contains(dst, "/bin/") {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes the layout folder as a tarball, the form `skopeo copy
// oci-archive:` and `podman load` read.
func tarDir(dir, out string) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out + ".tmp")
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(out+".tmp", out)
}
