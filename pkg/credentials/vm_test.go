package credentials_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

const (
	// vmNamespace holds the VMs and their Secrets; storageNamespace the
	// BSLS main, of which only its users Secrets exist here: the test
	// writes them as the BSLS reconciler would.
	vmNamespace      = "vms"
	storageNamespace = "storage"
	bslsName         = "main"
	server           = storageNamespace + "/" + bslsName

	// Short versions of the reconciler's waits, so that the specs see
	// them end.
	orphanGrace = 8 * time.Second
	settleTime  = 4 * time.Second

	// reconciled bounds how long the controller may take to act on a change.
	reconciled = 20 * time.Second
)

// runController starts the Hasher, the VM and the bootstrap reconcilers
// in-process against api, as cmd/controller wires them and with its cache
// (the BSLS reconciler aside: the specs play its part); stop ends them and
// waits, bounded.
func runController(api *testbed.APIServer, metricsAddr string) (stop func() error, err error) {
	o := testbed.ManagerOptions{Logger: GinkgoLogr, MetricsAddr: metricsAddr, Cache: controller.Cache()}
	return testbed.RunManager(api, o, func(mgr ctrl.Manager) error {
		if err := (&credentials.Hasher{Client: mgr.GetClient(), Clock: hasherClock}).SetupWithManager(mgr, 2); err != nil {
			return err
		}
		if err := (&credentials.VMReconciler{OrphanGrace: orphanGrace, SettleTime: settleTime}).SetupWithManager(mgr); err != nil {
			return err
		}
		return (&credentials.BootstrapReconciler{}).SetupWithManager(mgr)
	})
}

// hasherClock is the Hasher's clock: the specs move it past a rotation's
// grace period rather than wait a day.
var hasherClock = clocktesting.NewFakePassiveClock(time.Now())

// credentialSecret is VM vm's Secret as the webhook writes it for the
// specs' BSLS.
func credentialSecret(vm, password, generation string) *corev1.Secret {
	return testbed.CredentialSecret(vmNamespace, vm, storageNamespace+"/"+bslsName, password, generation)
}

// virtualMachine is a stopped VM opted in to serverRef ("" for none).
func virtualMachine(name, serverRef string) *kubevirtv1.VirtualMachine {
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: vmNamespace},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{}}},
			},
		},
	}
	if serverRef != "" {
		vm.Annotations = map[string]string{v1alpha1.AnnotationServer: serverRef}
	}
	return vm
}

var _ = Describe("The VM credential reconciler", Ordered, func() {
	var (
		ctx            context.Context
		api            *testbed.APIServer
		stopController func() error
		metricsAddr    string
	)

	startController := func() {
		GinkgoHelper()
		if metricsAddr == "" {
			port, err := testbed.FreePort()
			Expect(err).NotTo(HaveOccurred())
			metricsAddr = "127.0.0.1:" + strconv.Itoa(port)
		}
		stop, err := runController(api, metricsAddr)
		Expect(err).NotTo(HaveOccurred())
		stopController = stop
	}
	restartController := func(whileStopped func()) {
		GinkgoHelper()
		Expect(stopController()).To(Succeed())
		whileStopped()
		startController()
	}

	secretKey := func(vm string) types.NamespacedName {
		return types.NamespacedName{Namespace: vmNamespace, Name: v1alpha1.CredentialSecretName(vm)}
	}
	secretOf := func(vm string) *corev1.Secret {
		GinkgoHelper()
		s := &corev1.Secret{}
		Expect(api.Client.Get(ctx, secretKey(vm), s)).To(Succeed())
		return s
	}
	// secretGone fails while the Secret exists, and on any other error.
	secretGone := func(vm string) func() error {
		return func() error {
			err := api.Client.Get(ctx, secretKey(vm), &corev1.Secret{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err == nil {
				return fmt.Errorf("Secret %s still exists", secretKey(vm))
			}
			return err
		}
	}
	secretExists := func(vm string) func() error {
		return func() error { return api.Client.Get(ctx, secretKey(vm), &corev1.Secret{}) }
	}
	ownerRefs := func(vm string) func() []metav1.OwnerReference {
		return func() []metav1.OwnerReference {
			s := &corev1.Secret{}
			if err := api.Client.Get(ctx, secretKey(vm), s); err != nil {
				return nil
			}
			return s.OwnerReferences
		}
	}
	ownerRefTo := func(vm *kubevirtv1.VirtualMachine) []metav1.OwnerReference {
		return []metav1.OwnerReference{{
			APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID,
			// The VM controls its Secret: the fact its user is provisioned from.
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false),
		}}
	}
	create := func(objs ...client.Object) {
		GinkgoHelper()
		for _, o := range objs {
			Expect(api.Client.Create(ctx, o)).To(Succeed())
		}
	}
	createAdopted := func(name, password string) (*kubevirtv1.VirtualMachine, *corev1.Secret) {
		GinkgoHelper()
		s, vm := credentialSecret(name, password, "1"), virtualMachine(name, server)
		create(s, vm)
		Eventually(ownerRefs(name)).WithTimeout(reconciled).Should(Equal(ownerRefTo(vm)))
		return vm, s
	}
	updateVM := func(vm *kubevirtv1.VirtualMachine, change func(*kubevirtv1.VirtualMachine)) {
		GinkgoHelper()
		Eventually(func() error {
			cur := &kubevirtv1.VirtualMachine{}
			if err := api.Client.Get(ctx, client.ObjectKeyFromObject(vm), cur); err != nil {
				return err
			}
			change(cur)
			return api.Client.Update(ctx, cur)
		}).WithTimeout(10 * time.Second).Should(Succeed())
	}
	updateSecret := func(vm string, change func(*corev1.Secret)) {
		GinkgoHelper()
		// Conflicts with the controller's own writes are retried.
		Eventually(func() error {
			cur := &corev1.Secret{}
			if err := api.Client.Get(ctx, secretKey(vm), cur); err != nil {
				return err
			}
			change(cur)
			return api.Client.Update(ctx, cur)
		}).WithTimeout(10 * time.Second).Should(Succeed())
	}
	// hashed waits for the Hasher's hash of the Secret's current generation.
	hashed := func(vm string) identity.Hash {
		GinkgoHelper()
		var h *identity.Hash
		Eventually(func() *identity.Hash {
			s := &corev1.Secret{}
			if err := api.Client.Get(ctx, secretKey(vm), s); err != nil {
				return nil
			}
			h = credentials.CurrentHash(s)
			return h
		}).WithTimeout(reconciled).ShouldNot(BeNil())
		return *h
	}
	// provisionOn writes username's hash into the users Secret of its shard
	// of the BSLS storage/bsls, as the BSLS reconciler does.
	provisionOn := func(bsls, username string, h identity.Hash) {
		GinkgoHelper()
		shard := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
			Name: userset.SecretName(bsls, userset.ShardOf(username)), Namespace: storageNamespace,
		}}
		_, err := controllerutil.CreateOrUpdate(ctx, api.Client, shard, func() error {
			users := map[string]identity.Hash{}
			if data := shard.Data[userset.Key]; len(data) > 0 {
				var err error
				if users, err = userset.Decode(data); err != nil {
					return err
				}
			}
			users[username] = h
			shard.Labels = map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, userset.Label: bsls}
			shard.Data = map[string][]byte{userset.Key: userset.Encode(users)}
			return nil
		})
		Expect(err).NotTo(HaveOccurred())
	}
	provision := func(username string, h identity.Hash) {
		GinkgoHelper()
		provisionOn(bslsName, username, h)
	}
	// toPhase moves vmi to phase as KubeVirt's virt-controller and
	// virt-handler do, recording the transition's time
	// (controller.SetVMIPhaseTransitionTimestamp): the specs play them.
	toPhase := func(vmi *kubevirtv1.VirtualMachineInstance, phase kubevirtv1.VirtualMachineInstancePhase) {
		GinkgoHelper()
		Eventually(func() error {
			if err := api.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi); err != nil {
				return err
			}
			vmi.Status.Phase = phase
			vmi.Status.PhaseTransitionTimestamps = append(vmi.Status.PhaseTransitionTimestamps,
				kubevirtv1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: phase, PhaseTransitionTimestamp: metav1.Now()})
			// KubeVirt's instances have no status subresource.
			return api.Client.Update(ctx, vmi)
		}).WithTimeout(reconciled).Should(Succeed())
	}
	// nextSecond waits until the clock is in a later second: times in an
	// object's status have a resolution of a second.
	nextSecond := func() {
		GinkgoHelper()
		testbed.SleepPastSecondOf(time.Now())
	}
	// events lists "Reason: message" of each Event recorded on the VM of
	// that UID, once per occurrence: the recorder counts a repeated Event
	// in its count rather than writing it again.
	events := func(vm *kubevirtv1.VirtualMachine) func() []string {
		return func() []string {
			list := &corev1.EventList{}
			if err := api.Client.List(ctx, list, client.InNamespace(vmNamespace)); err != nil {
				return nil
			}
			var out []string
			for _, e := range list.Items {
				if e.InvolvedObject.Kind != "VirtualMachine" || e.InvolvedObject.UID != vm.UID {
					continue
				}
				for range max(e.Count, 1) {
					out = append(out, e.Reason+": "+e.Message)
				}
			}
			return out
		}
	}
	withReason := func(reason string) func([]string) []string {
		return func(all []string) []string {
			var out []string
			for _, e := range all {
				if strings.HasPrefix(e, reason+": ") {
					out = append(out, e)
				}
			}
			return out
		}
	}
	// noSecretsIn checks that no Event on the VM carries its password or
	// any hash held for it.
	noSecretsIn := func(vm *kubevirtv1.VirtualMachine, secrets ...string) {
		GinkgoHelper()
		for _, e := range events(vm)() {
			for _, s := range secrets {
				Expect(e).NotTo(ContainSubstring(s))
			}
		}
	}

	BeforeAll(func() {
		ctx = context.Background()
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
		for _, name := range []string{vmNamespace, storageNamespace} {
			create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
		}
		startController()
		DeferCleanup(func() { Expect(stopController()).To(Succeed()) })
	})

	It("adopts the webhook's Secret once the VM exists, and not before", func() {
		s := credentialSecret("adopt", testbed.RandomPassword(), "1")
		create(s)
		Consistently(ownerRefs("adopt")).WithTimeout(2 * time.Second).Should(BeEmpty())

		vm := virtualMachine("adopt", server)
		create(vm)
		Eventually(ownerRefs("adopt")).WithTimeout(reconciled).Should(Equal(ownerRefTo(vm)))
		Expect(secretOf("adopt").UID).To(Equal(s.UID), "adopted, not re-created")
	})

	It("adopts it again for a VM re-created under the same name while the controller was down", func() {
		old := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: vmNamespace, Name: "adopt"}, old)).To(Succeed())
		vm := virtualMachine("adopt", server)
		restartController(func() {
			Expect(api.Client.Delete(ctx, old)).To(Succeed())
			create(vm)
		})
		Expect(vm.UID).NotTo(Equal(old.UID))
		Eventually(ownerRefs("adopt")).WithTimeout(reconciled).Should(Equal(ownerRefTo(vm)))
	})

	It("adopts it again for a VM re-created right after the webhook rewrote the Secret", func() {
		s := secretOf("adopt")
		old := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: vmNamespace, Name: "adopt"}, old)).To(Succeed())
		// Admission of the new VM rewrites the Secret (its payload) before
		// the API server stores the VM; the old VM is already gone then. A
		// Secret written moments ago is not deleted for want of a VM.
		updateSecret("adopt", func(s *corev1.Secret) {
			s.Data[v1alpha1.SecretKeyUserData] = []byte("#cloud-config\nhostname: adopt\n")
		})
		Expect(api.Client.Delete(ctx, old)).To(Succeed())
		vm := virtualMachine("adopt", server)
		create(vm)
		Eventually(ownerRefs("adopt")).WithTimeout(reconciled).Should(Equal(ownerRefTo(vm)))
		Expect(secretOf("adopt").UID).To(Equal(s.UID), "the Secret survived the re-creation")
	})

	It("records the CredentialsIssued Event the webhook left at the VM's creation once the VM exists, with its UID, once", func() {
		s := credentialSecret("issued", testbed.RandomPassword(), "1")
		msg := "Issued Kopia credentials for issued@vms on BackupStorageLocationServer storage/main (generation 1, cloud-init mode, Secret issued-guestbackup)"
		s.Annotations[vmsecret.AnnotationIssuedEvent] = msg
		create(s)
		vm := virtualMachine("issued", server)
		create(vm)
		Eventually(events(vm)).WithTimeout(reconciled).Should(ContainElement("CredentialsIssued: " + msg))
		Eventually(func() map[string]string { return secretOf("issued").Annotations }).WithTimeout(reconciled).ShouldNot(HaveKey(vmsecret.AnnotationIssuedEvent))
		restartController(func() {})
		Consistently(func() []string { return withReason("CredentialsIssued")(events(vm)()) }).WithTimeout(3 * time.Second).Should(HaveLen(1))
	})

	It("revokes the user of a VM that opts out: deletes the Secret and records UserRevoked on the VM", func() {
		password := testbed.RandomPassword()
		vm, _ := createAdopted("optout", password)
		updateVM(vm, func(vm *kubevirtv1.VirtualMachine) { delete(vm.Annotations, v1alpha1.AnnotationServer) })
		Eventually(secretGone("optout")).WithTimeout(reconciled).Should(Succeed())
		Eventually(events(vm)).WithTimeout(reconciled).Should(ConsistOf(
			"UserRevoked: User optout@vms revoked from BackupStorageLocationServer storage/main (credentials generation 1): " +
				"the VirtualMachine no longer has annotation guestbackup.io/server; deleted Secret optout-guestbackup"))
		noSecretsIn(vm, password)
	})

	It("never deletes a Secret a volume of its VM still reads, and deletes it once none does", func() {
		s, vm := credentialSecret("inuse", testbed.RandomPassword(), "1"), virtualMachine("inuse", server)
		// What a VM whose opt-out never reached the webhook looks like:
		// its cloud-init still reads the Secret.
		vm.Spec.Template.Spec.Volumes = []kubevirtv1.Volume{{Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{
			CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: s.Name}},
		}}}
		create(s, vm)
		Eventually(ownerRefs("inuse")).WithTimeout(reconciled).Should(Equal(ownerRefTo(vm)))
		updateVM(vm, func(vm *kubevirtv1.VirtualMachine) { delete(vm.Annotations, v1alpha1.AnnotationServer) })
		Eventually(events(vm)).WithTimeout(reconciled).Should(ContainElement(
			"SecretInUse: Secret inuse-guestbackup is kept although the VirtualMachine no longer has annotation guestbackup.io/server: " +
				"volume cloudinit of the VirtualMachine still reads it (its cloud-init would be lost); it is deleted once no volume does, and its user is not provisioned meanwhile"))
		Consistently(secretExists("inuse")).WithTimeout(settleTime + 2*time.Second).Should(Succeed())

		updateVM(vm, func(vm *kubevirtv1.VirtualMachine) { vm.Spec.Template.Spec.Volumes = nil })
		Eventually(secretGone("inuse")).WithTimeout(reconciled).Should(Succeed())
		Eventually(events(vm)).WithTimeout(reconciled).Should(WithTransform(withReason("UserRevoked"), HaveLen(1)))
	})

	It("revokes the user of a VM that names another server", func() {
		vm, _ := createAdopted("moved", testbed.RandomPassword())
		updateVM(vm, func(vm *kubevirtv1.VirtualMachine) { vm.Annotations[v1alpha1.AnnotationServer] = "storage/other" })
		Eventually(secretGone("moved")).WithTimeout(reconciled).Should(Succeed())
		Eventually(events(vm)).WithTimeout(reconciled).Should(ConsistOf(And(
			HavePrefix("UserRevoked: User moved@vms revoked from BackupStorageLocationServer storage/main (credentials generation 1)"),
			ContainSubstring("names storage/other instead"))))
	})

	It("deletes the adopted Secret of a deleted VM (no garbage collector needed)", func() {
		vm, _ := createAdopted("gone", testbed.RandomPassword())
		Expect(api.Client.Delete(ctx, vm)).To(Succeed())
		Eventually(secretGone("gone")).WithTimeout(reconciled).Should(Succeed())
	})

	It("keeps a Secret whose VM never appeared for the grace period, and deletes it after", func() {
		s := credentialSecret("never", testbed.RandomPassword(), "1")
		create(s)
		Consistently(secretExists("never")).WithTimeout(orphanGrace - 3*time.Second).Should(Succeed())
		Eventually(secretGone("never")).WithTimeout(reconciled).Should(Succeed())
		// The API server's timestamps have whole seconds.
		Expect(time.Since(s.CreationTimestamp.Time)).To(BeNumerically(">=", orphanGrace-time.Second))
	})

	It("never deletes a Secret that is not managed by guestbackup", func() {
		unmanaged := func(vm string) *corev1.Secret {
			s := credentialSecret(vm, testbed.RandomPassword(), "1")
			delete(s.Labels, v1alpha1.LabelManagedBy)
			return s
		}
		// One under the name of a VM that does not opt in, one under the
		// name of a VM deleted since, one whose VM never appears.
		optedOut := virtualMachine("foreign", "")
		deleted := virtualMachine("stray", server)
		create(unmanaged("foreign"), unmanaged("stray"), unmanaged("nobody"), optedOut, deleted)
		Expect(api.Client.Delete(ctx, deleted)).To(Succeed())
		names := []string{"foreign", "stray", "nobody"}
		Consistently(func() error {
			for _, vm := range names {
				if err := secretExists(vm)(); err != nil {
					return err
				}
			}
			return nil
		}).WithTimeout(orphanGrace + settleTime + 2*time.Second).Should(Succeed())
		for _, vm := range names {
			Expect(ownerRefs(vm)()).To(BeEmpty(), vm)
		}
		Expect(events(optedOut)()).To(BeEmpty())
	})

	Describe("a rotation while the VM's guest runs", Ordered, func() {
		var (
			vm            *kubevirtv1.VirtualMachine
			vmi           *kubevirtv1.VirtualMachineInstance
			first, second identity.Hash
		)
		// serverHash is the hash the server is given for the VM's user.
		serverHash := func() *identity.Hash { return credentials.HashFor(secretOf("rotating")) }
		rotateTo := func(generation string) {
			GinkgoHelper()
			updateSecret("rotating", func(s *corev1.Secret) {
				s.Data[v1alpha1.SecretKeyPassword] = []byte(testbed.RandomPassword())
				s.Data[v1alpha1.SecretKeyGeneration] = []byte(generation)
				s.Annotations[v1alpha1.AnnotationIssuedAt] = time.Now().UTC().Format(time.RFC3339Nano)
			})
		}
		// newInstance creates the VM's instance as virt-controller does
		// (Pending, then Scheduling once its launcher pod exists).
		newInstance := func() *kubevirtv1.VirtualMachineInstance {
			GinkgoHelper()
			vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "rotating", Namespace: vmNamespace}, Spec: vm.Spec.Template.Spec}
			create(vmi)
			toPhase(vmi, kubevirtv1.Pending)
			toPhase(vmi, kubevirtv1.Scheduling)
			return vmi
		}
		// started moves vmi on as KubeVirt does once its launcher pod's
		// compute container runs (virt-controller: Scheduled) and its
		// guest boots (virt-handler: Running), in a later second than
		// anything before: phase transition times have a resolution of a
		// second.
		started := func(vmi *kubevirtv1.VirtualMachineInstance) {
			GinkgoHelper()
			nextSecond()
			toPhase(vmi, kubevirtv1.Scheduled)
			toPhase(vmi, kubevirtv1.Running)
			nextSecond()
		}

		It("keeps the server accepting the previous password while a guest started before the rotation runs, and says so on the VM", func() {
			vm, _ = createAdopted("rotating", testbed.RandomPassword())
			first = hashed("rotating")
			provision("rotating@vms", first)
			Eventually(events(vm)).WithTimeout(reconciled).Should(ContainElement(HavePrefix("UserProvisioned:")))
			vmi = newInstance()
			started(vmi)
			rotateTo("2")
			second = hashed("rotating")
			Expect(second).NotTo(Equal(first))
			Consistently(serverHash).WithTimeout(2 * time.Second).Should(HaveValue(Equal(first)))
			Eventually(events(vm)).WithTimeout(reconciled).Should(ContainElement(HavePrefix(
				"RotationPending: Credentials generation 2 is ready; the server keeps accepting generation 1's password until the guest restarts with the new one")))
		})

		It("gives the server the new password once that guest stopped, before its instance is gone", func() {
			toPhase(vmi, kubevirtv1.Succeeded)
			Eventually(serverHash).WithTimeout(reconciled).Should(HaveValue(Equal(second)))
			Expect(secretOf("rotating").Data).NotTo(HaveKey(vmsecret.KeyPreviousPasswordHash))
			Expect(api.Client.Delete(ctx, vmi)).To(Succeed())
		})

		It("gives the server a stopped VM's new password at once", func() {
			before := len(events(vm)())
			rotateTo("3")
			third := hashed("rotating")
			Expect(serverHash()).To(HaveValue(Equal(third)))
			Expect(secretOf("rotating").Data).NotTo(HaveKey(vmsecret.KeyPreviousPasswordHash))
			Consistently(events(vm)).WithTimeout(2 * time.Second).Should(HaveLen(before))
		})

		// KubeVirt reads the Secret when the launcher pod
		// starts, not when the instance is created. An instance whose pod
		// waits (for a node, an image) across a rotation boots with the
		// new password: keeping the old one would lock it out for a day.
		It("gives the server the new password at once when the instance was created before the rotation but its launcher pod had not started", func() {
			before := len(events(vm)())
			vmi = newInstance()
			nextSecond()
			rotateTo("4")
			fourth := hashed("rotating")
			Expect(serverHash()).To(HaveValue(Equal(fourth)), "the guest will boot with generation 4")
			Expect(secretOf("rotating").Data).NotTo(HaveKey(vmsecret.KeyPreviousPasswordHash))

			By("the launcher pod starting after the rotation")
			started(vmi)
			Consistently(serverHash).WithTimeout(2 * time.Second).Should(HaveValue(Equal(fourth)))
			Expect(events(vm)()).To(HaveLen(before), "no RotationPending: nothing is kept")
		})

		It("gives the server the new password when the grace period ends, though the guest has not restarted, and warns on the VM", func() {
			DeferCleanup(func() { _ = api.Client.Delete(ctx, vmi) })
			rotateTo("5")
			fifth := hashed("rotating")
			Expect(serverHash()).NotTo(HaveValue(Equal(fifth)), "kept while the guest runs")

			hasherClock.SetTime(time.Now().Add(credentials.DefaultRotationGrace + time.Minute))
			DeferCleanup(func() { hasherClock.SetTime(time.Now()) })
			// Any change brings the Secret back to the Hasher, as its
			// requeue at the deadline would.
			updateSecret("rotating", func(s *corev1.Secret) { s.Labels["touched"] = "1" })
			Eventually(serverHash).WithTimeout(reconciled).Should(HaveValue(Equal(fifth)))
			Eventually(events(vm)).WithTimeout(reconciled).Should(ContainElement(HavePrefix(
				"RotationForced: Generation 4's password no longer authenticates although the guest has not restarted since the rotation")))
		})
	})
	Describe("announcing the user's provisioning", Ordered, func() {
		var (
			vm        *kubevirtv1.VirtualMachine
			passwords []string
			hashes    []string
		)
		const username = "announce@vms"

		BeforeAll(func() {
			passwords = append(passwords, testbed.RandomPassword())
			vm, _ = createAdopted("announce", passwords[0])
		})
		AfterAll(func() { noSecretsIn(vm, append(passwords, hashes...)...) })

		It("records UserProvisioned once the users Secret holds the current hash, and not before", func() {
			h := hashed("announce")
			hashes = append(hashes, h.String())
			Consistently(events(vm)).WithTimeout(2 * time.Second).Should(BeEmpty())

			By("not counting another hash for the user")
			stale, err := identity.NewHash(testbed.RandomPassword(), identity.Scrypt)
			Expect(err).NotTo(HaveOccurred())
			provision(username, stale)
			Consistently(events(vm)).WithTimeout(2 * time.Second).Should(BeEmpty())

			By("announcing the current one")
			provision(username, h)
			Eventually(events(vm)).WithTimeout(reconciled).Should(ConsistOf(
				"UserProvisioned: User announce@vms provisioned on BackupStorageLocationServer storage/main (credentials generation 1)"))
			Expect(secretOf("announce").Annotations).To(And(
				HaveKeyWithValue(vmsecret.AnnotationAnnouncedGeneration, "1"),
				HaveKeyWithValue(vmsecret.AnnotationAnnouncedServer, server)))

			By("timing it, from the webhook's issue, on the metrics endpoint")
			Expect(testbed.Metric(metricsAddr, "guestbackup_user_provisioning_seconds",
				map[string]string{"namespace": storageNamespace, "bsls": bslsName})).To(BeNumerically(">=", 1))
		})

		rotate := func(generation string) identity.Hash {
			GinkgoHelper()
			password := testbed.RandomPassword()
			passwords = append(passwords, password)
			updateSecret("announce", func(s *corev1.Secret) {
				s.Data[v1alpha1.SecretKeyPassword] = []byte(password)
				s.Data[v1alpha1.SecretKeyGeneration] = []byte(generation)
			})
			h := hashed("announce")
			hashes = append(hashes, h.String())
			return h
		}

		It("records CredentialsRotated once the rotated hash is provisioned, once per generation", func() {
			h := rotate("2")
			Consistently(events(vm)).WithTimeout(2*time.Second).Should(HaveLen(1), "the users Secret still holds generation 1")
			provision(username, h)
			Eventually(events(vm)).WithTimeout(reconciled).Should(ContainElement(
				"CredentialsRotated: User announce@vms on BackupStorageLocationServer storage/main: credentials rotated from generation 1 to 2; " +
					"the previous password no longer authenticates"))

			h = rotate("3")
			provision(username, h)
			Eventually(events(vm)).WithTimeout(reconciled).Should(ContainElement(ContainSubstring("rotated from generation 2 to 3")))
			Consistently(events(vm)).WithTimeout(2 * time.Second).Should(HaveLen(3))
			Expect(withReason("UserProvisioned")(events(vm)())).To(HaveLen(1))
			Expect(withReason("CredentialsRotated")(events(vm)())).To(HaveLen(2))
		})

		It("records nothing twice across resyncs and a restart of the controller", func() {
			before := events(vm)()
			// Each of these reaches the reconciler: a change of the
			// credential Secret, of the users Secret, a restart.
			updateSecret("announce", func(s *corev1.Secret) { s.Labels["touched"] = "1" })
			provision("other@vms", hashed("announce"))
			restartController(func() {})
			updateSecret("announce", func(s *corev1.Secret) { s.Labels["touched"] = "2" })
			Consistently(events(vm)).WithTimeout(3 * time.Second).Should(Equal(before))
		})

		It("announces the user on the server the VM moved to, keeping the Secret the webhook rewrote for it", func() {
			password := testbed.RandomPassword()
			passwords = append(passwords, password)
			// The webhook rewrites the Secret for the new server, with the
			// next generation, before the API server stores the VM.
			s := secretOf("announce")
			updateSecret("announce", func(s *corev1.Secret) {
				s.Labels[v1alpha1.LabelServerName] = "second"
				s.Data[v1alpha1.SecretKeyPassword] = []byte(password)
				s.Data[v1alpha1.SecretKeyGeneration] = []byte("4")
			})
			updateVM(vm, func(vm *kubevirtv1.VirtualMachine) {
				vm.Annotations[v1alpha1.AnnotationServer] = storageNamespace + "/second"
			})
			h := hashed("announce")
			hashes = append(hashes, h.String())
			provisionOn("second", username, h)
			Eventually(events(vm)).WithTimeout(reconciled).Should(ContainElement(
				"UserProvisioned: User announce@vms provisioned on BackupStorageLocationServer storage/second (credentials generation 4)"))
			Expect(secretOf("announce").UID).To(Equal(s.UID), "the rewritten Secret was not revoked")
			Expect(withReason("UserRevoked")(events(vm)())).To(BeEmpty())
		})
	})

	Describe("the hash algorithm the BSLS asks for", Ordered, func() {
		const name = "fips"
		var bsls *v1alpha1.BackupStorageLocationServer
		setChoice := func(choice v1alpha1.PasswordHash) {
			GinkgoHelper()
			Eventually(func() error {
				cur := &v1alpha1.BackupStorageLocationServer{}
				if err := api.Client.Get(ctx, client.ObjectKeyFromObject(bsls), cur); err != nil {
					return err
				}
				cur.Spec.Access.PasswordHash = choice
				return api.Client.Update(ctx, cur)
			}).WithTimeout(10 * time.Second).Should(Succeed())
		}
		// hashedAs waits for the current generation's hash and checks that
		// it has version and verifies password.
		hashedAs := func(version identity.HashVersion, password string) identity.Hash {
			GinkgoHelper()
			h := hashed(name)
			Expect(h.Version).To(Equal(version))
			Expect(h.Matches(password)).To(BeTrue())
			return h
		}
		password := testbed.RandomPassword()
		var first identity.Hash

		BeforeAll(func() {
			bsls = &v1alpha1.BackupStorageLocationServer{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: storageNamespace},
				Spec: v1alpha1.BackupStorageLocationServerSpec{
					Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
					Access:  v1alpha1.AccessSpec{PasswordHash: v1alpha1.PasswordHashPBKDF2},
				},
			}
			create(bsls)
		})

		It("hashes a new VM's password with PBKDF2 when its BSLS asks for it", func() {
			s, vm := credentialSecret(name, password, "1"), virtualMachine(name, storageNamespace+"/"+name)
			s.Labels[v1alpha1.LabelServerName] = name
			create(s, vm)
			first = hashedAs(identity.PBKDF2, password)
		})

		It("keeps existing users' hashes when the BSLS switches to scrypt: no re-hash, the password still verifies", func() {
			setChoice(v1alpha1.PasswordHashScrypt)
			// A resync of the Secret brings it back to the Hasher.
			updateSecret(name, func(s *corev1.Secret) { s.Labels["touched"] = "1" })
			Consistently(func() *identity.Hash { return credentials.HashFor(secretOf(name)) }).
				WithTimeout(3 * time.Second).Should(HaveValue(Equal(first)))
		})

		It("hashes the next generation with the new choice", func() {
			rotated := testbed.RandomPassword()
			updateSecret(name, func(s *corev1.Secret) {
				s.Data[v1alpha1.SecretKeyPassword] = []byte(rotated)
				s.Data[v1alpha1.SecretKeyGeneration] = []byte("2")
				s.Annotations[v1alpha1.AnnotationIssuedAt] = time.Now().UTC().Format(time.RFC3339Nano)
			})
			Eventually(func() identity.HashVersion {
				h := credentials.CurrentHash(secretOf(name))
				if h == nil {
					return 0
				}
				return h.Version
			}).WithTimeout(reconciled).Should(Equal(identity.Scrypt))
			hashedAs(identity.Scrypt, rotated)
		})
	})
})
