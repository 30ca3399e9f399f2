package credentials_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// ownCloudConfig is the owner's own inline cloud-config of the merged VM.
const ownCloudConfig = "#cloud-config\n# the owner's own, kept byte for byte\nruncmd:\n  - [touch, /var/tmp/owner-was-here]\n"

var _ = Describe("The bootstrap reconciler", Ordered, func() {
	const (
		otherVMs     = "elsewhere"
		otherStorage = "storage-b"
		oldEndpoint  = "https://main.storage.svc:51515"
		newEndpoint  = "https://backup.example.com:8443"
	)
	var (
		ctx      context.Context
		api      *testbed.APIServer
		oldCA    []byte
		newCA    []byte
		injected = map[string]*kubevirtv1.VirtualMachine{}
	)

	caPEM := func(name string) []byte {
		GinkgoHelper()
		ca, err := pki.NewCA(name, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		return pki.EncodeCert(ca.Cert)
	}
	// publish sets what a BSLS publishes, as the BSLS reconciler does.
	publish := func(key types.NamespacedName, endpoint string, ca []byte) {
		GinkgoHelper()
		Eventually(func() error {
			cur := &v1alpha1.BackupStorageLocationServer{}
			if err := api.Client.Get(ctx, key, cur); err != nil {
				return err
			}
			cur.Status.Endpoint, cur.Status.TLSCA = endpoint, string(ca)
			return api.Client.Status().Update(ctx, cur)
		}).WithTimeout(10 * time.Second).Should(Succeed())
	}
	createServer := func(key types.NamespacedName) *v1alpha1.BackupStorageLocationServer {
		GinkgoHelper()
		bsls := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
				Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{}},
			},
		}
		Expect(api.Client.Create(ctx, bsls)).To(Succeed())
		publish(key, oldEndpoint, oldCA)
		Expect(api.Client.Get(ctx, key, bsls)).To(Succeed())
		return bsls
	}
	// admit runs the webhook's decision on vm, and stores the Secret and
	// the VM it decided, in that order, as the API server does.
	admit := func(vm *kubevirtv1.VirtualMachine, bsls *v1alpha1.BackupStorageLocationServer) *kubevirtv1.VirtualMachine {
		GinkgoHelper()
		object, err := json.Marshal(vm)
		Expect(err).NotTo(HaveOccurred())
		d, err := mutate.Decide(mutate.Input{
			Object: object, Namespace: vm.Namespace, NewPassword: mutate.NewPassword, Now: time.Now(),
			Server: mutate.Server{BSLS: bsls, NamespaceAllowed: true},
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(d.Denied).To(BeEmpty())
		ops, err := json.Marshal(d.Patch)
		Expect(err).NotTo(HaveOccurred())
		patch, err := jsonpatchapply.DecodePatch(ops)
		Expect(err).NotTo(HaveOccurred())
		patched, err := patch.Apply(object)
		Expect(err).NotTo(HaveOccurred())
		stored := &kubevirtv1.VirtualMachine{}
		Expect(json.Unmarshal(patched, stored)).To(Succeed())
		Expect(api.Client.Create(ctx, d.Secret)).To(Succeed())
		Expect(api.Client.Create(ctx, stored)).To(Succeed())
		return stored
	}
	vmFor := func(namespace, name string, annotations map[string]string, volumes ...kubevirtv1.Volume) *kubevirtv1.VirtualMachine {
		var disks []kubevirtv1.Disk
		for _, v := range volumes {
			disks = append(disks, kubevirtv1.Disk{Name: v.Name})
		}
		return &kubevirtv1.VirtualMachine{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"},
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Annotations: annotations},
			Spec: kubevirtv1.VirtualMachineSpec{
				RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
				Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain:  kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Disks: disks}},
					Volumes: volumes,
				}},
			},
		}
	}
	secretOf := func(namespace, vm string) *corev1.Secret {
		GinkgoHelper()
		s := &corev1.Secret{}
		Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: vmsecret.Name(vm)}, s)).To(Succeed())
		return s
	}
	adopted := func(vm *kubevirtv1.VirtualMachine) {
		GinkgoHelper()
		Eventually(func() bool {
			s := &corev1.Secret{}
			return api.Client.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vmsecret.Name(vm.Name)}, s) == nil &&
				vmsecret.ControlledBy(s, vm.Name, vm.UID)
		}).WithTimeout(reconciled).Should(BeTrue())
	}
	eventsOf := func(vm *kubevirtv1.VirtualMachine, reason string) func() []string {
		return func() []string {
			list := &corev1.EventList{}
			if err := api.Client.List(ctx, list, client.InNamespace(vm.Namespace)); err != nil {
				return nil
			}
			var out []string
			for _, e := range list.Items {
				if e.InvolvedObject.UID == vm.UID && e.Reason == reason {
					out = append(out, e.Message)
				}
			}
			return out
		}
	}
	// installed boots the guest's side of the Secret on a scratch root, as
	// the guest does, and returns the CA its kopia would trust and the
	// configuration (the server's URL) it connects with: real
	// cloud-init processes the user-data (merging the owner's part and
	// ours) and sh runs our bootcmd; in disk mode, sh runs install.sh from
	// the Secret's files as the disk mounts them.
	installed := func(s *corev1.Secret) (ca, conf string) {
		GinkgoHelper()
		root := GinkgoT().TempDir()
		if install, ok := s.Data[vmsecret.KeyInstall]; ok {
			disk := GinkgoT().TempDir()
			for k, v := range s.Data {
				Expect(os.WriteFile(filepath.Join(disk, k), v, 0o600)).To(Succeed())
			}
			Expect(install).NotTo(BeEmpty())
			out, err := testbed.Run(ctx, time.Minute, disk, []string{"DESTDIR=" + root}, "/bin/sh", filepath.Join(disk, vmsecret.KeyInstall))
			Expect(err).NotTo(HaveOccurred(), string(out))
		} else {
			out, err := testbed.RunBootCmd(GinkgoT(), s.Data[vmsecret.KeyUserData], cloudinit.BootCmdMarker, root, []string{"GUESTBACKUP_ROOT=" + root})
			Expect(err).NotTo(HaveOccurred(), out)
		}
		trust, err := os.ReadFile(filepath.Join(root, cloudinit.TrustDir, "ca.crt"))
		Expect(err).NotTo(HaveOccurred())
		config, err := os.ReadFile(filepath.Join(root, cloudinit.ConfDir, "guestbackup.conf"))
		Expect(err).NotTo(HaveOccurred())
		return string(trust), string(config)
	}
	installedCA := func(s *corev1.Secret) string {
		GinkgoHelper()
		ca, _ := installed(s)
		return ca
	}
	// ownerPart is the owner's own user-data in the Secret, "" for none.
	ownerPart := func(s *corev1.Secret) string {
		part, err := cloudinit.UserPart(s.Data[vmsecret.KeyUserData])
		if err != nil {
			return ""
		}
		return string(part)
	}

	var main, other *v1alpha1.BackupStorageLocationServer
	var foreign *corev1.Secret
	var elsewhere *kubevirtv1.VirtualMachine

	BeforeAll(func() {
		ctx = context.Background()
		oldCA, newCA = caPEM("old CA"), caPEM("renewed CA")
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
		for _, name := range []string{vmNamespace, storageNamespace, otherVMs, otherStorage} {
			Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
		}
		main = createServer(types.NamespacedName{Namespace: storageNamespace, Name: bslsName})
		other = createServer(types.NamespacedName{Namespace: otherStorage, Name: bslsName})

		on := func(bsls *v1alpha1.BackupStorageLocationServer, more ...string) map[string]string {
			a := map[string]string{v1alpha1.AnnotationServer: bsls.Namespace + "/" + bsls.Name, v1alpha1.AnnotationPaths: "/srv"}
			for i := 0; i+1 < len(more); i += 2 {
				a[more[i]] = more[i+1]
			}
			return a
		}
		injected["plain"] = admit(vmFor(vmNamespace, "plain", on(main)), main)
		injected["merged"] = admit(vmFor(vmNamespace, "merged", on(main), kubevirtv1.Volume{
			Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: ownCloudConfig}},
		}), main)
		injected["disk"] = admit(vmFor(vmNamespace, "disk", on(main, v1alpha1.AnnotationMode, v1alpha1.ModeDisk)), main)
		// A VM on another namespace's server of the same name.
		elsewhere = admit(vmFor(otherVMs, "elsewhere", on(other)), other)
		// A Secret of a VM's name that is not guestbackup's, its VM opted in.
		foreign = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: vmNamespace, Name: vmsecret.Name("foreign"), Labels: map[string]string{vmsecret.LabelVM: "foreign"}},
			Data: map[string][]byte{
				vmsecret.KeyUserData: []byte("#cloud-config\n"), vmsecret.KeyPassword: []byte("someone else's"), vmsecret.KeyGeneration: []byte("1"),
			},
		}
		Expect(api.Client.Create(ctx, foreign)).To(Succeed())
		Expect(api.Client.Create(ctx, vmFor(vmNamespace, "foreign", on(main)))).To(Succeed())

		stop, err := runController(api, "")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(stop()).To(Succeed()) })
		for _, vm := range injected {
			adopted(vm)
		}
		adopted(elsewhere)
	})

	It("leaves every Secret as the webhook wrote it while the server publishes what it was rendered with", func() {
		for name, vm := range injected {
			Expect(installedCA(secretOf(vmNamespace, name))).To(Equal(string(oldCA)), name)
			Consistently(eventsOf(vm, credentials.ReasonBootstrapUpdated)).WithTimeout(2*time.Second).Should(BeEmpty(), name)
		}
	})

	It("renders every injected VM's Secret again for a renewed CA and a new URL, and says so on the VM", func() {
		before := map[string]*corev1.Secret{}
		for name := range injected {
			before[name] = secretOf(vmNamespace, name)
		}
		elsewhereBefore := secretOf(otherVMs, "elsewhere")
		publish(client.ObjectKeyFromObject(main), newEndpoint, newCA)

		for name, vm := range injected {
			By("re-rendering " + name)
			Eventually(func() string {
				endpoint, ca := vmsecret.Rendered(secretOf(vmNamespace, name))
				return endpoint + " " + ca
			}).WithTimeout(reconciled).Should(Equal(newEndpoint + " " + vmsecret.CASum(newCA)))
			s, was := secretOf(vmNamespace, name), before[name]
			ca, conf := installed(s)
			Expect(ca).To(Equal(string(newCA)), "the guest trusts the renewed CA")
			Expect(conf).To(ContainSubstring(newEndpoint), "the guest connects to the new URL")
			for _, k := range []string{vmsecret.KeyUsername, vmsecret.KeyPassword, vmsecret.KeyGeneration} {
				Expect(s.Data[k]).To(Equal(was.Data[k]), "%s: same %s", name, k)
			}
			Expect(vmsecret.ControlledBy(s, vm.Name, vm.UID)).To(BeTrue())
			Expect(ownerPart(s)).To(Equal(ownerPart(was)), "%s: the owner's part byte for byte", name)
			if name == "merged" {
				Expect(ownerPart(s)).To(Equal(ownCloudConfig))
			}
			if name == "disk" {
				Expect(s.Data).NotTo(HaveKey(vmsecret.KeyUserData), "disk mode stays disk mode")
			} else {
				Expect(s.Data).NotTo(HaveKey(vmsecret.KeyInstall), "cloud-init mode stays cloud-init mode")
			}
			By("the webhook, admitting " + name + " again, finding nothing to write: one rendering")
			stored := &kubevirtv1.VirtualMachine{}
			Expect(api.Client.Get(ctx, client.ObjectKeyFromObject(vm), stored)).To(Succeed())
			object, err := json.Marshal(stored)
			Expect(err).NotTo(HaveOccurred())
			bsls := &v1alpha1.BackupStorageLocationServer{}
			Expect(api.Client.Get(ctx, client.ObjectKeyFromObject(main), bsls)).To(Succeed())
			again, err := mutate.Decide(mutate.Input{
				Object: object, OldObject: object, Namespace: vm.Namespace, Secret: s, NewPassword: mutate.NewPassword, Now: time.Now(),
				Server: mutate.Server{BSLS: bsls, NamespaceAllowed: true},
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(again.Denied).To(BeEmpty())
			Expect(again.Secret).To(BeNil(), "the webhook would render %s's payload otherwise", name)
			Expect(again.Patch).To(BeEmpty())

			Eventually(eventsOf(vm, credentials.ReasonBootstrapUpdated)).WithTimeout(reconciled).Should(ConsistOf(
				And(ContainSubstring(newEndpoint), ContainSubstring(vmsecret.CASum(newCA)), ContainSubstring("next start"),
					Not(ContainSubstring(string(was.Data[vmsecret.KeyPassword]))))))
		}

		By("leaving a VM of another namespace's server of the same name, and a Secret that is not guestbackup's")
		Consistently(func() string {
			return secretOf(otherVMs, "elsewhere").ResourceVersion
		}).WithTimeout(3 * time.Second).Should(Equal(elsewhereBefore.ResourceVersion))
		Expect(secretOf(vmNamespace, "foreign").ResourceVersion).To(Equal(foreign.ResourceVersion))
		Expect(eventsOf(elsewhere, credentials.ReasonBootstrapUpdated)()).To(BeEmpty())
	})

	It("renders nothing while the server publishes no CA, and again once it does", func() {
		rv := secretOf(vmNamespace, "plain").ResourceVersion
		publish(client.ObjectKeyFromObject(main), newEndpoint, nil)
		Consistently(func() string { return secretOf(vmNamespace, "plain").ResourceVersion }).WithTimeout(3 * time.Second).Should(Equal(rv))

		renewed := caPEM("renewed again")
		publish(client.ObjectKeyFromObject(main), newEndpoint, renewed)
		Eventually(func() string { return installedCA(secretOf(vmNamespace, "plain")) }).WithTimeout(reconciled).Should(Equal(string(renewed)))
		Eventually(eventsOf(injected["plain"], credentials.ReasonBootstrapUpdated)).WithTimeout(reconciled).Should(HaveLen(2))
	})
})
