// Package testbed starts the real components guestbackup is proven against:
// a Kubernetes API server (envtest, with the BSLS, KubeVirt VirtualMachine and
// cert-manager CRDs), Kopia repository servers and clients on loopback,
// Debian's cloud-init schema validator, and a real node (StartNode: kubelet,
// containerd, kube-scheduler and kube-controller-manager) that runs the
// product's image as the chart installs it.
//
// The binaries come from hack/tools.sh (run `make tools`); the environment it
// prints (`hack/tools.sh env`) points here, and when it is not set the
// package asks the script itself. Every process a test starts is stopped by
// that test's cleanup, in its own process group, with bounded waits; its log
// is printed when the test fails.
//
// Functions take a TB, which *testing.T, *testing.B and Ginkgo's GinkgoT()
// all satisfy, so plain tests and Ginkgo suites share one harness.
package testbed

// TB is the part of testing.TB the harness needs.
type TB interface {
	Helper()
	Cleanup(func())
	Failed() bool
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	TempDir() string
}
