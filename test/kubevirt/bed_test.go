package kubevirt

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/test/story"
)

// localBed is the local test bed: guestbackup's managers in this process,
// the BSLS's server from the Deployment the controller writes, run as local
// processes, and guests under qemu realised from the instances KubeVirt's
// virt-controller made.
type localBed struct {
	backupPlatform
}

func startLocalBed(ctx context.Context, bslsNamespace string, namespaces ...string) story.Bed {
	GinkgoHelper()
	// As the cluster bed's chart: with requests (test/story's GuestSnapshot).
	return &localBed{startBackupPlatformWith(ctx, local.Options{Logger: GinkgoLogr, Requests: true}, bslsNamespace, namespaces...)}
}

func (b *localBed) Client() client.Client                       { return b.API.Client }
func (b *localBed) BSLS() *v1alpha1.BackupStorageLocationServer { return b.bsls }
func (b *localBed) ServerURL() string                           { return fmt.Sprintf("https://127.0.0.1:%d", b.port) }
func (b *localBed) Guest(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	return vm
}

func (b *localBed) Kubeconfig() string { return b.API.Kubeconfig(GinkgoT()) }

func (b *localBed) Events(ctx context.Context, namespace, kind, name string) ([]string, error) {
	return b.Platform.Events(ctx, namespace, kind, name)
}

func (b *localBed) Boot(vm *kubevirtv1.VirtualMachine) testbed.GuestResult {
	GinkgoHelper()
	opts, err := b.Realise(context.Background(), vm)
	Expect(err).NotTo(HaveOccurred())
	res := testbed.BootGuest(GinkgoT(), opts)
	GinkgoWriter.Printf("guest of VM %s: boot to power off %v (%v of qemu's CPU); first snapshot attempted at %ss of uptime\n",
		vm.Name, res.Elapsed.Round(time.Second), res.CPU.Round(time.Second), story.Markers(res.Console)["uptime"])
	return res
}
