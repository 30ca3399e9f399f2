package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// abortTB is a test whose Fatalf ends the call it was made in, as
// testing's does, but without failing the test, and whose cleanups the
// test runs itself: the way to see what a start that fails leaves behind.
type abortTB struct {
	*testing.T
	cleanups ownCleanups
	fatal    string
}

// aborted is what abortTB's Fatalf panics with.
type aborted struct{}

func (a *abortTB) Cleanup(f func()) { a.cleanups.add(f) }

func (a *abortTB) Fatalf(format string, args ...any) {
	a.fatal = fmt.Sprintf(format, args...)
	panic(aborted{})
}

// run calls f, recovering from a Fatalf, then runs the cleanups as the
// test's end would.
func (a *abortTB) run(f func()) {
	defer a.cleanups.run()
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(aborted); !ok {
				panic(r)
			}
		}
	}()
	f()
}

// An API server that starts but fails what follows (here, a CRD it
// refuses) is stopped with the test, etcd too: a failed BeforeSuite must
// not leave them running for the rest of make test.
func TestAPIServerThatFailsToStartLeavesNothingRunning(t *testing.T) {
	RequireTestBed(t)
	refused := t.TempDir()
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: misnamed.example.com # the API server wants brokens.example.com
spec:
  group: example.com
  names: {kind: Broken, plural: brokens}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object}}
`
	if err := os.WriteFile(filepath.Join(refused, "broken.yaml"), []byte(crd), 0o600); err != nil {
		t.Fatal(err)
	}
	var env *envtest.Environment
	// Whatever this test sees, nothing outlives it.
	t.Cleanup(func() {
		if env != nil {
			_ = env.Stop()
		}
	})
	// The control plane's folders, given rather than allocated, name its
	// processes on their command lines.
	etcdDir, certDir := filepath.Join(refused, "etcd"), filepath.Join(refused, "certs")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	tb := &abortTB{T: t}
	tb.run(func() {
		StartAPIServer(tb, APIServerOptions{Configure: func(e *envtest.Environment) error {
			env = e
			e.CRDDirectoryPaths = append(e.CRDDirectoryPaths, refused)
			e.CRDInstallOptions.MaxTime = 10 * time.Second
			e.ControlPlane.Etcd = &envtest.Etcd{DataDir: etcdDir}
			e.ControlPlane.GetAPIServer().CertDir = certDir
			return nil
		}})
		t.Fatal("the API server started with a CRD it must refuse")
	})
	if !strings.Contains(tb.fatal, "start API server") {
		t.Fatalf("StartAPIServer failed with %q, want its start failing", tb.fatal)
	}
	if _, err := os.Stat(filepath.Join(etcdDir, "member")); err != nil {
		t.Fatalf("etcd never wrote its data (%v): this test proves nothing", err)
	}
	for _, dir := range []string{etcdDir, certDir} {
		if pids := processesNaming(t, dir); len(pids) > 0 {
			t.Errorf("processes %v (%s) still run after the test's cleanup", pids, dir)
		}
	}
}

// processesNaming returns the PIDs of the processes whose command line
// names s.
func processesNaming(t *testing.T, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // not a process, or one that has exited
		}
		if strings.Contains(string(cmdline), s) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}
