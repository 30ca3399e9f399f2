package testbed

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// Tools are the test bed's binaries, built by hack/tools.sh.
type Tools struct {
	// Assets is the folder holding kube-apiserver and etcd (KUBEBUILDER_ASSETS).
	Assets string
	// Kopia is the kopia binary.
	Kopia string
	// KopiaARM64 is the same kopia built for linux/arm64, which server
	// pods serve to arm64 guests.
	KopiaARM64 string
	// Helm is the helm binary.
	Helm string
	// Kubectl is the kubectl binary (the chart's test runs the README's
	// commands with it).
	Kubectl string
	// MinIO is the minio binary, the test bed's S3 endpoint.
	MinIO string
	// FakeGCS is fake-gcs-server, the test bed's Google Cloud Storage;
	// Azurite is the main script of Azurite's blob service, the test bed's
	// Azure Blob Storage, run by node. Only their starters need them.
	FakeGCS, Azurite string
	// ControllerGen is the controller-gen binary.
	ControllerGen string
	// CloudInitSchema runs Debian's `cloud-init schema`.
	CloudInitSchema string
	// VirtAPI and VirtController are KubeVirt's control plane; only the
	// suites that start it need them built (see StartKubeVirt).
	VirtAPI, VirtController string
	// GuestImage is the folder of the Linux guest's image; only the tests
	// that boot a guest need it built (see LoadGuestImage).
	GuestImage string
	// GuestImageStock is the folder of the stock-like guest image (no
	// kopia); only the tests that boot it need it built.
	GuestImageStock string
	// Kubelet, KubeScheduler, KubeControllerManager and PauseImage (an OCI
	// tarball) make the real node; only the suites that start one need them
	// built (see StartNode).
	Kubelet, KubeScheduler, KubeControllerManager, PauseImage string
	// KubeVirtImages is the folder of KubeVirt's images and virt-operator's
	// manifest (hack/kubevirt-images.sh); only the cluster backend needs it
	// built (see InstallKubeVirt).
	KubeVirtImages string
}

var toolEnv = map[string]func(*Tools) *string{
	"KUBEBUILDER_ASSETS":                  func(t *Tools) *string { return &t.Assets },
	"GUESTBACKUP_KOPIA":                   func(t *Tools) *string { return &t.Kopia },
	"GUESTBACKUP_KOPIA_ARM64":             func(t *Tools) *string { return &t.KopiaARM64 },
	"GUESTBACKUP_HELM":                    func(t *Tools) *string { return &t.Helm },
	"GUESTBACKUP_KUBECTL":                 func(t *Tools) *string { return &t.Kubectl },
	"GUESTBACKUP_MINIO":                   func(t *Tools) *string { return &t.MinIO },
	"GUESTBACKUP_FAKE_GCS":                func(t *Tools) *string { return &t.FakeGCS },
	"GUESTBACKUP_AZURITE":                 func(t *Tools) *string { return &t.Azurite },
	"GUESTBACKUP_CONTROLLER_GEN":          func(t *Tools) *string { return &t.ControllerGen },
	"GUESTBACKUP_CLOUD_INIT_SCHEMA":       func(t *Tools) *string { return &t.CloudInitSchema },
	"GUESTBACKUP_GUEST_IMAGE":             func(t *Tools) *string { return &t.GuestImage },
	"GUESTBACKUP_GUEST_IMAGE_STOCK":       func(t *Tools) *string { return &t.GuestImageStock },
	"GUESTBACKUP_VIRT_API":                func(t *Tools) *string { return &t.VirtAPI },
	"GUESTBACKUP_VIRT_CONTROLLER":         func(t *Tools) *string { return &t.VirtController },
	"GUESTBACKUP_KUBELET":                 func(t *Tools) *string { return &t.Kubelet },
	"GUESTBACKUP_KUBE_SCHEDULER":          func(t *Tools) *string { return &t.KubeScheduler },
	"GUESTBACKUP_KUBE_CONTROLLER_MANAGER": func(t *Tools) *string { return &t.KubeControllerManager },
	"GUESTBACKUP_PAUSE_IMAGE":             func(t *Tools) *string { return &t.PauseImage },
	"GUESTBACKUP_KUBEVIRT_IMAGES":         func(t *Tools) *string { return &t.KubeVirtImages },
}

// optionalTools are checked by the functions that use them, not by
// LoadTools, so a missing guest image fails only the guest tests.
var optionalTools = map[string]bool{"GUESTBACKUP_GUEST_IMAGE": true, "GUESTBACKUP_GUEST_IMAGE_STOCK": true, "GUESTBACKUP_FAKE_GCS": true, "GUESTBACKUP_AZURITE": true, "GUESTBACKUP_VIRT_API": true, "GUESTBACKUP_VIRT_CONTROLLER": true,
	"GUESTBACKUP_KUBELET": true, "GUESTBACKUP_KUBE_SCHEDULER": true, "GUESTBACKUP_KUBE_CONTROLLER_MANAGER": true, "GUESTBACKUP_PAUSE_IMAGE": true,
	"GUESTBACKUP_KUBEVIRT_IMAGES": true}

// NotListed begins the path of every tool that the package under test may
// not use, in the environment hack/test-exec.sh gives it: its line in
// hack/test-tools.txt does not list the tool (hack/tools.sh's NOT_LISTED).
const NotListed = "/nonexistent/not-in-hack-test-tools.txt/"

// mustBeGranted panics when path is a tool that the package under test may
// not use: a programming error of its line in hack/test-tools.txt, which
// must fail the package however the test treats the tool's failures (a
// test that expects a command to fail must not pass because the command is
// missing). Everything that runs a tool calls it first.
func mustBeGranted(path string) {
	if tool, ok := strings.CutPrefix(path, NotListed); ok {
		panic(fmt.Sprintf("this package's tests use the test bed's %s, which its line in hack/test-tools.txt does not list: add it there", tool))
	}
}

var (
	toolsOnce sync.Once
	tools     Tools
	toolsErr  error
)

// LoadTools finds the test bed's binaries: from the environment
// `hack/tools.sh env` prints, or, when it is not set, from the script itself.
// It fails, telling what to run, when one of them is not built.
func LoadTools() (Tools, error) {
	toolsOnce.Do(func() { tools, toolsErr = loadTools() })
	return tools, toolsErr
}

// MustTools is LoadTools that fails the test when a tool is missing.
func MustTools(tb TB) Tools {
	tb.Helper()
	RequireTestBed(tb)
	t, err := LoadTools()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	return t
}

func loadTools() (Tools, error) {
	var t Tools
	missing := false
	for name, field := range toolEnv {
		*field(&t) = os.Getenv(name)
		missing = missing || *field(&t) == ""
	}
	if missing {
		root, err := RepoRoot()
		if err != nil {
			return t, err
		}
		out, err := exec.Command(filepath.Join(root, "hack", "tools.sh"), "env").Output()
		if err != nil {
			return t, fmt.Errorf("hack/tools.sh env: %w", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			name, value, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
			if field, known := toolEnv[name]; ok && known && *field(&t) == "" {
				*field(&t) = value
			}
		}
	}
	var errs []error
	for name, field := range toolEnv {
		path := *field(&t)
		// A tool the package's line in hack/test-tools.txt does not list
		// (hack/test-exec.sh) is checked where it is used, and fails there
		// on a path that names the fix.
		if optionalTools[name] || strings.HasPrefix(path, NotListed) {
			continue
		}
		if name == "KUBEBUILDER_ASSETS" {
			path = filepath.Join(path, "kube-apiserver")
		}
		if info, err := os.Stat(path); path == "" || err != nil || info.IsDir() {
			errs = append(errs, fmt.Errorf("%s: %q is not built", name, path))
		}
	}
	if len(errs) > 0 {
		return t, fmt.Errorf("test bed tools missing, run `make tools` (or `make test`): %w", errors.Join(errs...))
	}
	return t, nil
}

// RepoRoot is the repository's root folder: the one holding go.mod. It is
// found from this package's source when the build kept its path, else (a
// build with -trimpath, as make's) from the working folder, which go test
// sets to the package's own.
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	start := filepath.Dir(file)
	if !ok || !filepath.IsAbs(file) {
		wd, err := os.Getwd()
		if err != nil {
			return "", fmt.Errorf("locate the repository: %w", err)
		}
		start = wd
	}
	for dir := start; ; dir = filepath.Dir(dir) {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && declares(mod, modulePath) {
			return dir, nil
		}
		if parent := filepath.Dir(dir); parent == dir {
			return "", fmt.Errorf("no go.mod of %s above %s", modulePath, start)
		}
	}
}

// modulePath is the repository's module.
const modulePath = "github.com/guestbackup/guestbackup"

// declares tells whether the go.mod text mod declares module path: the
// tool modules under hack/tools hold go.mod files too.
func declares(mod []byte, path string) bool {
	for line := range strings.Lines(string(mod)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == path {
			return true
		}
	}
	return false
}
