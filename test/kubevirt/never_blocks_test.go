package kubevirt

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/test/story"
)

// neverBlocksSpecs: the webhook never stands in a VM's life (docs/design.md,
// decision 16): only creation and changes to what guestbackup manages reach
// it; an injected VM is never denied because its server is unhealthy or
// gone; deletion always passes. They run on a tenant (team-n,
// backup-n/main) of the bed shared.
func neverBlocksSpecs(shared func() *webhookBed) bool {
	return Describe("A VM's life with the webhook in the way", Ordered, func() {
		var (
			ctx context.Context
			bed *webhookBed
		)
		const finalizer = "example.com/keep"

		update := func(name string, f func(*kubevirtv1.VirtualMachine)) error {
			_, err := bed.update(ctx, name, f)
			return err
		}
		generation := func(name string) string {
			GinkgoHelper()
			s, err := bed.secretOf(ctx, name)()
			Expect(err).NotTo(HaveOccurred())
			return string(s.Data[v1alpha1.SecretKeyGeneration])
		}
		// everyDayEdits are what a VM's owner and KubeVirt do to an opted-in
		// VM all day: none concerns guestbackup.
		everyDayEdits := func(name string) {
			GinkgoHelper()
			Expect(update(name, func(vm *kubevirtv1.VirtualMachine) { vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyAlways) })).To(Succeed(), "start")
			Expect(update(name, func(vm *kubevirtv1.VirtualMachine) { vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyHalted) })).To(Succeed(), "stop")
			Expect(update(name, func(vm *kubevirtv1.VirtualMachine) { vm.Labels = map[string]string{"tier": "db"} })).To(Succeed(), "a label")
			Expect(update(name, func(vm *kubevirtv1.VirtualMachine) { vm.Finalizers = append(vm.Finalizers, finalizer) })).To(Succeed(), "a finalizer")
			// virt-controller writes the status too: again on a conflict.
			Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
				vm := bed.getVM(ctx, name)
				vm.Status.PrintableStatus = kubevirtv1.VirtualMachineStatusStopped
				return bed.api.Client.Status().Update(ctx, vm)
			})).To(Succeed(), "the status")
		}
		// deleteThroughFinalizer deletes the VM and removes the finalizer that
		// holds it, as the finalizer's controller would.
		deleteThroughFinalizer := func(name string) {
			GinkgoHelper()
			Expect(bed.api.Client.Delete(ctx, bed.getVM(ctx, name))).To(Succeed())
			Expect(update(name, func(vm *kubevirtv1.VirtualMachine) {
				vm.Finalizers = nil
			})).To(Succeed(), "the finalizer's removal")
			Eventually(func() bool {
				return apierrors.IsNotFound(bed.api.Client.Get(ctx, bed.key(name), &kubevirtv1.VirtualMachine{}))
			}).Should(BeTrue())
		}

		BeforeAll(func() {
			ctx = context.Background()
			bed = shared().tenant(ctx, "team-n", "backup-n")
		})

		It("never sends start, stop, labels, finalizers, status or a deletion of an opted-in VM to the webhook", func() {
			Expect(bed.api.Client.Create(ctx, bed.optIn(story.TypicalVM("quiet")))).To(Succeed())
			seen := bed.requests.n.Load()
			everyDayEdits("quiet")
			deleteThroughFinalizer("quiet")
			Expect(bed.requests.n.Load()).To(Equal(seen), "requests that reached the webhook")
		})

		It("admits twenty opted-in VMs created back to back while the server provisions users", func() {
			// What the BSLS says while a new VM's hash is pending: each new
			// VM's Secret makes it so for a moment.
			bed.setServerStatus(ctx, metav1.ConditionFalse, "UsersSynced", "Not True: UsersSynced (HashPending: 1 credential Secret waits for its hash)")
			DeferCleanup(func() { bed.setServerStatus(ctx, metav1.ConditionTrue, "Ready", "ready") })
			for i := range 20 {
				name := "pool-" + strconv.Itoa(i)
				Expect(bed.api.Client.Create(ctx, bed.optIn(story.TypicalVM(name)))).To(Succeed(), name)
				Expect(bed.getVM(ctx, name).Annotations).To(HaveKey(v1alpha1.AnnotationStatus), name)
			}
		})

		It("lets an injected VM start, stop, change and go while its server is not Ready, and after it is deleted", func() {
			Expect(bed.api.Client.Create(ctx, bed.optIn(story.TypicalVM("steady")))).To(Succeed())
			addDisk := func(name string) func(*kubevirtv1.VirtualMachine) {
				return func(vm *kubevirtv1.VirtualMachine) {
					vm.Spec.Template.Spec.Volumes = append(vm.Spec.Template.Spec.Volumes, kubevirtv1.Volume{
						Name: name, VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/data:1"}},
					})
					vm.Spec.Template.Spec.Domain.Devices.Disks = append(vm.Spec.Template.Spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: name})
				}
			}

			By("the server not Ready: its certificate renews")
			bed.setServerStatus(ctx, metav1.ConditionFalse, "CertificateReady", "Not True: CertificateReady")
			everyDayEdits("steady")
			seen := bed.requests.n.Load()
			Expect(update("steady", addDisk("data"))).To(Succeed(), "a new disk")
			Expect(update("steady", func(vm *kubevirtv1.VirtualMachine) { vm.Annotations[v1alpha1.AnnotationPaths] = "/etc,/srv" })).To(Succeed(), "new paths")
			Expect(bed.requests.n.Load()).To(BeNumerically(">", seen), "the template and annotation edits reached the webhook")
			Eventually(func() ([]byte, error) {
				s, err := bed.secretOf(ctx, "steady")()
				return s.Data[v1alpha1.SecretKeyUserData], err
			}).Should(ContainSubstring("/srv"), "the server's endpoint and CA are known: the new paths are rendered")

			By("the server deleted")
			Expect(bed.api.Client.Delete(ctx, &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Namespace: bed.bslsNamespace, Name: "main"}})).To(Succeed())
			DeferCleanup(bed.createServer, ctx)
			Eventually(func() bool {
				return apierrors.IsNotFound(bed.api.Client.Get(ctx, client.ObjectKey{Namespace: bed.bslsNamespace, Name: "main"}, &v1alpha1.BackupStorageLocationServer{}))
			}).Should(BeTrue())
			before := generation("steady")
			everyDayEdits("steady")
			Expect(update("steady", addDisk("logs"))).To(Succeed(), "a new disk")
			Expect(update("steady", func(vm *kubevirtv1.VirtualMachine) { vm.Annotations[v1alpha1.AnnotationPaths] = "/home" })).To(Succeed(), "new paths")
			Expect(generation("steady")).To(Equal(before), "the credentials stay as they were")
			Eventually(bed.vmEvents(ctx, "steady")).Should(ContainElement(ContainSubstring(
				"Warning InjectionNotUpdated: BackupStorageLocationServer " + bed.server() + " does not exist: the VM is admitted and its Secret steady-guestbackup kept as it was")))
			Expect(update("steady", func(vm *kubevirtv1.VirtualMachine) {
				// The owner's manifest applied again: without what was injected.
				drop := func(name string) bool { return name == mutate.CloudInitVolume }
				vm.Spec.Template.Spec.Volumes = slices.DeleteFunc(vm.Spec.Template.Spec.Volumes, func(v kubevirtv1.Volume) bool { return drop(v.Name) })
				vm.Spec.Template.Spec.Domain.Devices.Disks = slices.DeleteFunc(vm.Spec.Template.Spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return drop(d.Name) })
			})).To(Succeed(), "the owner's manifest applied again")
			Eventually(bed.vmEvents(ctx, "steady")).Should(ContainElement(ContainSubstring(
				"the VM is admitted without the volume guestbackup-cloudinit that reads its Secret steady-guestbackup, which this update removed")))
			deleteThroughFinalizer("steady")
		})

		It("admits an update of a VM being deleted unchanged, issuing nothing", func() {
			Expect(bed.api.Client.Create(ctx, bed.optIn(story.TypicalVM("leaving")))).To(Succeed())
			Expect(update("leaving", func(vm *kubevirtv1.VirtualMachine) { vm.Finalizers = []string{finalizer} })).To(Succeed())
			Expect(bed.api.Client.Delete(ctx, bed.getVM(ctx, "leaving"))).To(Succeed())
			before := generation("leaving")
			seen := bed.requests.n.Load()
			Expect(update("leaving", func(vm *kubevirtv1.VirtualMachine) { vm.Annotations[v1alpha1.AnnotationRotate] = "now" })).To(Succeed())
			Expect(generation("leaving")).To(Equal(before), "no credentials issued to a VM being deleted")
			Expect(bed.requests.n.Load()).To(Equal(seen))
			deleteThroughFinalizer("leaving")
		})

		It("while the webhook is down, lets opted-in VMs start, stop, change and go; refuses only opt-ins and changes to guestbackup's annotations", func() {
			Expect(bed.api.Client.Create(ctx, bed.optIn(story.TypicalVM("outage")))).To(Succeed())
			plain := story.TypicalVM("plain")
			plain.Namespace, plain.Annotations = bed.namespace, nil
			Expect(bed.api.Client.Create(ctx, plain)).To(Succeed())
			bed.requests.down.Store(true)
			DeferCleanup(func() { bed.requests.down.Store(false) })

			everyDayEdits("outage")
			deleteThroughFinalizer("outage")
			Expect(update("plain", func(vm *kubevirtv1.VirtualMachine) { vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyAlways) })).To(Succeed())

			refused := MatchError(ContainSubstring(fmt.Sprintf("failed calling webhook %q", mutate.WebhookName)))
			Expect(bed.api.Client.Create(ctx, bed.optIn(story.TypicalVM("newcomer")))).To(refused, "a new opt-in")
			Expect(update("plain", func(vm *kubevirtv1.VirtualMachine) {
				vm.Annotations = map[string]string{v1alpha1.AnnotationServer: bed.server()}
			})).To(refused, "an opt-in of a running VM")
			_, err := bed.secretOf(ctx, "newcomer")()
			Expect(apierrors.IsNotFound(err)).To(BeTrue())
		})
	})
}
