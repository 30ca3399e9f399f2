package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	kvcluster "github.com/guestbackup/guestbackup/internal/cluster"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/test/story"
)

// clusterBed is real KubeVirt on the test bed's real node: guestbackup
// installed with `helm install` of its chart, KubeVirt from virt-operator,
// and VMs started by their runStrategy, which KubeVirt's virt-handler and
// virt-launcher boot under QEMU (TCG) in pods (kvcluster.Start).
type clusterBed struct {
	*kvcluster.Backend
}

// clusterBootTimeout bounds a guest's boot to power-off on the cluster:
// 4-5.5 minutes were seen beside a loaded test run.
const clusterBootTimeout = 15 * time.Minute

// startClusterBed starts the cluster backend with the namespaces (the
// BSLS's first) labelled as the BSLS admits them, and its BSLS Ready.
func startClusterBed(ctx context.Context, bslsNamespace string, namespaces ...string) story.Bed {
	GinkgoHelper()
	// virt-handler's node labeller runs `chmod o+rw /dev/kvm` in its
	// privileged container: that must be the container's device node, never
	// the shared machine's.
	kvmBefore, kvmErr := os.Stat("/dev/kvm")
	cb, err := kvcluster.Start(GinkgoT(), kvcluster.Options{
		Tag: "cluster-e2e", BSLSNamespace: bslsNamespace, Namespaces: namespaces, NamespaceLabels: map[string]string{"backup": "allowed"}, Requests: true,
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

func (b *clusterBed) Client() client.Client                       { return b.Backend.Client }
func (b *clusterBed) BSLS() *v1alpha1.BackupStorageLocationServer { return b.Backend.BSLS }
func (b *clusterBed) ServerURL() string                           { return b.Backend.ServerURL }
func (b *clusterBed) Guest(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	testbed.ClusterGuest(vm, b.Images)
	return vm
}

func (b *clusterBed) Kubeconfig() string { return b.Node.Kubeconfig(GinkgoT()) }

func (b *clusterBed) Events(ctx context.Context, namespace, kind, name string) ([]string, error) {
	return local.EventsOf(ctx, b.Node.API.Client, namespace, kind, name)
}

// Boot starts the VM and reads its guest's console through virt-api. It
// checks, while the guest runs, that KubeVirt's own node processes run it:
// virt-handler, virt-launcher, libvirtd and QEMU, each started by
// containerd's shim for a pod, and no QEMU of the test bed's.
func (b *clusterBed) Boot(vm *kubevirtv1.VirtualMachine) testbed.GuestResult {
	GinkgoHelper()
	boot, err := testbed.BootVM(context.Background(), b.Backend.Client, b.Node, client.ObjectKeyFromObject(vm), clusterBootTimeout)
	if err != nil {
		b.Node.LogContainers(GinkgoT(), 40)
	}
	Expect(err).NotTo(HaveOccurred(), "the guest's console so far:\n%s", lastLines(boot.Console, 40))
	var seen []string
	for _, p := range boot.Processes {
		seen = append(seen, fmt.Sprintf("%s[%d] shim=%v testbed=%v", p.Command, p.PID, p.UnderShim, p.OfTestBed))
	}
	GinkgoWriter.Printf("guest of VM %s on the cluster: Running to power off %v; first snapshot attempted at %ss of uptime; processes: %s\n",
		vm.Name, boot.Elapsed.Round(time.Second), story.Markers(boot.Console)["uptime"], strings.Join(seen, ", "))
	for _, command := range []string{"virt-handler", "virt-launcher", "libvirtd", "qemu-system-x86_64"} {
		Expect(boot.Processes).To(ContainElement(And(HaveField("Command", command), HaveField("UnderShim", true))),
			"%s run by containerd's shim for a pod, while the guest ran", command)
	}
	Expect(boot.Processes).NotTo(ContainElement(And(HaveField("Command", "qemu-system-x86_64"), HaveField("OfTestBed", true))),
		"no QEMU started by the test bed")
	return boot.GuestResult
}

// ClaimClass makes a local volume of size on the node, of a class of its
// own that only a claim of that class binds, as a provisioner would.
func (b *clusterBed) ClaimClass(name, size string) string {
	class := "local-" + name
	b.Node.LocalVolume(GinkgoT(), name, class, size)
	return class
}

// ShellImage is virt-handler's image, which the node holds: a Debian root
// with a shell and coreutils.
func (b *clusterBed) ShellImage(ctx context.Context) (string, error) {
	ds := &appsv1.DaemonSet{}
	if err := b.Backend.Client.Get(ctx, types.NamespacedName{Namespace: testbed.KubeVirtNamespace, Name: "virt-handler"}, ds); err != nil {
		return "", fmt.Errorf("get virt-handler's DaemonSet: %w", err)
	}
	return ds.Spec.Template.Spec.Containers[0].Image, nil
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
