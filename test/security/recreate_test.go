package security

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
)

// A VM deleted while its credential Secret outlives it (kubectl delete
// --cascade=orphan, the garbage collector's window, the controller's settle
// time) and created again from a manifest that kept its volumes is the same
// VM. Its owner's cloud-init, merged into that Secret and nowhere else, is
// never rendered away.
var _ = Describe("A VM deleted and created again while its credential Secret outlives it", Ordered, func() {
	const (
		storageNS = "recreate-storage"
		ns        = "recreate-a"
		vmName    = "app"
		// ownersUserData is the owner's own cloud-init, inline in the VM:
		// the webhook merges it into the VM's credential Secret.
		ownersUserData = "#cloud-config\nwrite_files:\n  - path: /etc/app/owner.conf\n    content: \"the owner's own configuration\\n\"\n"
	)
	selector := map[string]string{"recreate.security.test/backup": "allowed"}
	var (
		owner  *Tenant
		stored *kubevirtv1.VirtualMachine
		before *corev1.Secret
	)
	secretKey := types.NamespacedName{Namespace: ns, Name: v1alpha1.CredentialSecretName(vmName)}

	BeforeAll(func() {
		newNamespace(storageNS, nil)
		newNamespace(ns, selector)
		owner = newTenant("recreate-owner", ns)
		serveBSLS(bslsFor(storageNS, "main", selector, false))
	})

	It("merges the owner's inline cloud-init into the Secret at creation", func() {
		vm := vmFor(ns, vmName, storageNS+"/main")
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: "cloudinitdisk", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}})
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: "cloudinitdisk", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: ownersUserData}}})
		Expect(owner.Client.Create(ctx, vm)).To(Succeed())
		stored = &kubevirtv1.VirtualMachine{}
		Expect(platform.API.Client.Get(ctx, client.ObjectKeyFromObject(vm), stored)).To(Succeed())
		Expect(stored.Annotations[v1alpha1.AnnotationStatus]).To(ContainSubstring(`"mergedFrom":"userData"`))
		before = &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, secretKey, before)).To(Succeed())
		Expect(cloudinit.UserPart(before.Data[v1alpha1.SecretKeyUserData])).To(BeEquivalentTo(ownersUserData))
	})

	It("keeps the owner's cloud-init, the placement and the credentials when the VM is created again without its status annotation", func() {
		By("deleting the VM, whose Secret the controller keeps for its settle time")
		Expect(owner.Client.Delete(ctx, stored)).To(Succeed())
		Eventually(func() error {
			return platform.API.Client.Get(ctx, client.ObjectKeyFromObject(stored), &kubevirtv1.VirtualMachine{})
		}).Should(Satisfy(apierrors.IsNotFound), "the VM is gone")

		By("creating it again from the manifest as stored, status annotation dropped")
		again := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: vmName, Namespace: ns, Annotations: map[string]string{v1alpha1.AnnotationServer: storageNS + "/main"}},
			Spec:       *stored.Spec.DeepCopy(),
		}
		Expect(again.Spec.Template.Spec.Volumes[1].CloudInitNoCloud.UserDataSecretRef).To(Equal(&corev1.LocalObjectReference{Name: secretKey.Name}),
			"the manifest's cloud-init volume reads the VM's own Secret")
		Expect(owner.Client.Create(ctx, again)).To(Succeed())

		after := &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, secretKey, after)).To(Succeed())
		Expect(after.UID).To(Equal(before.UID), "the same Secret outlived the VM: the spec reproduces the window it is about")
		Expect(cloudinit.UserPart(after.Data[v1alpha1.SecretKeyUserData])).To(BeEquivalentTo(ownersUserData), "the owner's cloud-init is still in the Secret")
		Expect(after.Data[v1alpha1.SecretKeyPassword]).To(Equal(before.Data[v1alpha1.SecretKeyPassword]), "the credentials are the VM's as before")
		// The controller may have adopted it for the new VM already: what
		// matters is that nothing ties it to the one deleted.
		Expect(after.OwnerReferences).NotTo(ContainElement(HaveField("UID", stored.UID)), "no garbage collector deletes it for the deleted VM")

		recreated := &kubevirtv1.VirtualMachine{}
		Expect(platform.API.Client.Get(ctx, client.ObjectKeyFromObject(again), recreated)).To(Succeed())
		Expect(recreated.Spec.Template.Spec.Volumes).To(Equal(stored.Spec.Template.Spec.Volumes), "no disk mode: the volumes are as the owner wrote them")
		var st v1alpha1.InjectionStatus
		Expect(json.Unmarshal([]byte(recreated.Annotations[v1alpha1.AnnotationStatus]), &st)).To(Succeed())
		Expect(st.Mode).To(Equal(v1alpha1.ModeCloudInit))
		Expect(st.MergedFrom).To(Equal("userData"))

		By("the controller adopting the Secret for the new VM")
		Eventually(func() []metav1.OwnerReference {
			Expect(platform.API.Client.Get(ctx, secretKey, after)).To(Succeed())
			return after.OwnerReferences
		}).WithTimeout(provisionTimeout).Should(ContainElement(HaveField("UID", recreated.UID)))
		stored = recreated
	})

	It("gives the owner's cloud-init back, byte for byte, when the VM opts out", func() {
		Eventually(func() error {
			vm := &kubevirtv1.VirtualMachine{}
			if err := owner.Client.Get(ctx, client.ObjectKeyFromObject(stored), vm); err != nil {
				return err
			}
			delete(vm.Annotations, v1alpha1.AnnotationServer)
			return owner.Client.Update(ctx, vm)
		}).Should(Succeed())
		vm := &kubevirtv1.VirtualMachine{}
		Expect(platform.API.Client.Get(ctx, client.ObjectKeyFromObject(stored), vm)).To(Succeed())
		Expect(vm.Annotations).NotTo(HaveKey(v1alpha1.AnnotationStatus))
		Expect(vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud).To(Equal(&kubevirtv1.CloudInitNoCloudSource{UserData: ownersUserData}))
	})
})

// The status annotation is the webhook's record of what it injected, and a
// tenant can write it too. A tenant of a namespace the BSLS does not admit
// who writes it, naming the BSLS, is refused by the webhook itself, at
// CREATE and at UPDATE: the annotation is never proof of an earlier
// injection.
var _ = Describe("A tenant forging the status annotation", Ordered, func() {
	const (
		storageNS = "forged-storage"
		ns        = "forged-a" // not admitted by the BSLS
	)
	var mallory *Tenant
	// forgedStatus is a status as the webhook writes it for VM vm of
	// BSLS forged-storage/main.
	forgedStatus := func(vm string) string {
		st, err := json.Marshal(v1alpha1.InjectionStatus{
			Mode: v1alpha1.ModeCloudInit, Server: storageNS + "/main", Secret: v1alpha1.CredentialSecretName(vm),
			User: vm + "@" + ns, Generation: 1, Volume: "guestbackup-cloudinit", Disk: "guestbackup-cloudinit",
		})
		Expect(err).NotTo(HaveOccurred())
		return string(st)
	}
	refused := func(err error, vm string) {
		GinkgoHelper()
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the admission is denied: %v", err)
		Expect(err).To(MatchError(ContainSubstring("BackupStorageLocationServer " + storageNS + "/main does not admit VMs of namespace " + ns)))
		Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.CredentialSecretName(vm)}, &corev1.Secret{})).
			To(Satisfy(apierrors.IsNotFound), "no credentials were issued")
	}

	BeforeAll(func() {
		newNamespace(storageNS, nil)
		newNamespace(ns, nil)
		mallory = newTenant("forged-mallory", ns)
		// The BSLS admits no namespace of hers; it need not serve for the
		// webhook to know that.
		Expect(platform.API.Client.Create(ctx, bslsFor(storageNS, "main", map[string]string{"forged.security.test/backup": "allowed"}, false))).To(Succeed())
	})

	It("is refused at CREATE", func() {
		vm := vmFor(ns, "sneak", storageNS+"/main")
		vm.Annotations[v1alpha1.AnnotationStatus] = forgedStatus("sneak")
		refused(mallory.Client.Create(ctx, vm), "sneak")
	})

	It("is refused at UPDATE", func() {
		vm := testbed.SmallVM(ns, "later", nil)
		Expect(mallory.Client.Create(ctx, vm)).To(Succeed(), "a VM that does not opt in is hers to create")
		var err error
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := mallory.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
				return err
			}
			vm.Annotations = map[string]string{v1alpha1.AnnotationServer: storageNS + "/main", v1alpha1.AnnotationStatus: forgedStatus("later")}
			err = mallory.Client.Update(ctx, vm)
			return ignoreForbidden(err)
		})).To(Succeed())
		refused(err, "later")
		Expect(platform.API.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm)).To(Succeed())
		Expect(vm.Annotations).NotTo(HaveKey(v1alpha1.AnnotationServer), "the VM is stored as she created it")
		Expect(vm.Annotations).NotTo(HaveKey(v1alpha1.AnnotationStatus))
	})
})

// ignoreForbidden is err, nil when it is a denial: a denial is what the
// caller examines, not a reason to retry.
func ignoreForbidden(err error) error {
	if apierrors.IsForbidden(err) {
		return nil
	}
	return err
}
