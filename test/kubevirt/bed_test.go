package kubevirt

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/cluster"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// clusterBackendEnv selects the cluster backend: GUESTBACKUP_E2E=cluster
// runs the specs labelled "cluster" on real KubeVirt on the test bed's real
// node. Never KUBECONFIG alone: the suite installs its own cluster.
const clusterBackendEnv = "GUESTBACKUP_E2E"

// clusterBackend is the label of the specs that run on the cluster backend.
const clusterBackend = "cluster"

// guestBed is where a story with real guests runs: guestbackup with an
// admin's BSLS <bslsNamespace>/main, and a way to boot a VM's guest until it
// powers itself off.
type guestBed interface {
	// Client is the cluster's admin client.
	Client() client.Client
	// BSLS is the admin's BSLS.
	BSLS() *v1alpha1.BackupStorageLocationServer
	// ServerURL is the BSLS's server as a kopia client on this machine
	// reaches it.
	ServerURL() string
	// Guest makes vm's first volume the test guest as this bed runs it.
	Guest(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine
	// Boot starts stored VM vm and returns its guest's console once the
	// guest powered itself off.
	Boot(vm *kubevirtv1.VirtualMachine) testbed.GuestResult
	// Events are the Events about an object, as "Type Reason: message".
	Events(ctx context.Context, namespace, kind, name string) ([]string, error)
}

// localBed is the local test bed: guestbackup's managers in this process,
// the BSLS's server from the Deployment the controller writes, run as local
// processes, and guests under qemu realised from the instances KubeVirt's
// virt-controller made.
type localBed struct {
	backupPlatform
}

func startLocalBed(ctx context.Context, bslsNamespace string, namespaces ...string) guestBed {
	GinkgoHelper()
	return &localBed{startBackupPlatform(ctx, bslsNamespace, namespaces...)}
}

func (b *localBed) Client() client.Client                       { return b.API.Client }
func (b *localBed) BSLS() *v1alpha1.BackupStorageLocationServer { return b.bsls }
func (b *localBed) ServerURL() string                           { return fmt.Sprintf("https://127.0.0.1:%d", b.port) }
func (b *localBed) Guest(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	return vm
}

func (b *localBed) Events(ctx context.Context, namespace, kind, name string) ([]string, error) {
	return b.Platform.Events(ctx, namespace, kind, name)
}

func (b *localBed) Boot(vm *kubevirtv1.VirtualMachine) testbed.GuestResult {
	GinkgoHelper()
	opts, err := b.Realise(context.Background(), vm)
	Expect(err).NotTo(HaveOccurred())
	res := testbed.BootGuest(GinkgoT(), opts)
	GinkgoWriter.Printf("guest of VM %s: boot to power off %v (%v of qemu's CPU); first snapshot attempted at %ss of uptime\n",
		vm.Name, res.Elapsed.Round(time.Second), res.CPU.Round(time.Second), e2eMarkers(res.Console)["uptime"])
	return res
}

// clusterBed is real KubeVirt on the test bed's real node: guestbackup
// installed with `helm install` of its chart, KubeVirt from virt-operator,
// and VMs started by their runStrategy, which KubeVirt's virt-handler and
// virt-launcher boot under QEMU (TCG) in pods (cluster.Start).
type clusterBed struct {
	*cluster.Backend
}

// clusterBootTimeout bounds a guest's boot to power-off on the cluster:
// 4-5.5 minutes were seen beside a loaded test run.
const clusterBootTimeout = 15 * time.Minute

// skipUnlessClusterBackend skips a spec of the cluster backend unless it
// was selected.
func skipUnlessClusterBackend() {
	if os.Getenv(clusterBackendEnv) != clusterBackend {
		Skip(fmt.Sprintf("the cluster backend runs with %s=%s (make test-cluster)", clusterBackendEnv, clusterBackend))
	}
}

// startClusterBed starts the cluster backend with the namespaces (the
// BSLS's first) labelled as the BSLS admits them, and its BSLS Ready.
func startClusterBed(ctx context.Context, bslsNamespace string, namespaces ...string) guestBed {
	GinkgoHelper()
	// virt-handler's node labeller runs `chmod o+rw /dev/kvm` in its
	// privileged container: that must be the container's device node, never
	// the shared machine's.
	kvmBefore, kvmErr := os.Stat("/dev/kvm")
	cb, err := cluster.Start(GinkgoT(), cluster.Options{
		Tag: "cluster-e2e", BSLSNamespace: bslsNamespace, Namespaces: namespaces, NamespaceLabels: map[string]string{"backup": "allowed"},
	})
	Expect(err).NotTo(HaveOccurred())
	if kvmErr == nil {
		kvmAfter, err := os.Stat("/dev/kvm")
		Expect(err).NotTo(HaveOccurred())
		Expect(kvmAfter.Mode()).To(Equal(kvmBefore.Mode()), "the machine's /dev/kvm, after KubeVirt's node labeller ran")
	}
	GinkgoWriter.Printf("cluster backend ready in %v: KubeVirt %s, guestbackup by helm, BSLS Ready at %s\n",
		cb.Elapsed.Round(time.Second), cb.Images.Version, cb.ServerURL)
	return &clusterBed{cb}
}

func (b *clusterBed) Client() client.Client                       { return b.Node.API.Client }
func (b *clusterBed) BSLS() *v1alpha1.BackupStorageLocationServer { return b.Backend.BSLS }
func (b *clusterBed) ServerURL() string                           { return b.Backend.ServerURL }
func (b *clusterBed) Guest(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	testbed.ClusterGuest(vm, b.Images)
	return vm
}

func (b *clusterBed) Events(ctx context.Context, namespace, kind, name string) ([]string, error) {
	return local.EventsOf(ctx, b.Node.API.Client, namespace, kind, name)
}

// Boot starts the VM and reads its guest's console through virt-api. It
// checks, while the guest runs, that KubeVirt's own node processes run it:
// virt-handler, virt-launcher, libvirtd and QEMU, each started by
// containerd's shim for a pod, and no QEMU of the test bed's.
func (b *clusterBed) Boot(vm *kubevirtv1.VirtualMachine) testbed.GuestResult {
	GinkgoHelper()
	boot, err := testbed.BootVM(context.Background(), b.Node, client.ObjectKeyFromObject(vm), clusterBootTimeout)
	if err != nil {
		b.Node.LogContainers(GinkgoT(), 40)
	}
	Expect(err).NotTo(HaveOccurred(), "the guest's console so far:\n%s", lastLines(boot.Console, 40))
	var seen []string
	for _, p := range boot.Processes {
		seen = append(seen, fmt.Sprintf("%s[%d] shim=%v testbed=%v", p.Command, p.PID, p.UnderShim, p.OfTestBed))
	}
	GinkgoWriter.Printf("guest of VM %s on the cluster: Running to power off %v; first snapshot attempted at %ss of uptime; processes: %s\n",
		vm.Name, boot.Elapsed.Round(time.Second), e2eMarkers(boot.Console)["uptime"], strings.Join(seen, ", "))
	for _, command := range []string{"virt-handler", "virt-launcher", "libvirtd", "qemu-system-x86_64"} {
		Expect(boot.Processes).To(ContainElement(And(HaveField("Command", command), HaveField("UnderShim", true))),
			"%s run by containerd's shim for a pod, while the guest ran", command)
	}
	Expect(boot.Processes).NotTo(ContainElement(And(HaveField("Command", "qemu-system-x86_64"), HaveField("OfTestBed", true))),
		"no QEMU started by the test bed")
	return boot.GuestResult
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
