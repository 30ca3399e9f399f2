package kubevirt

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubectl/pkg/describe"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
	"github.com/guestbackup/guestbackup/test/story"
)

// settleTime is the VM reconciler's, short.
const settleTime = 2 * time.Second

// ownCloudConfig is a VM owner's own inline cloud-config.
const ownCloudConfig = "#cloud-config\nwrite_files:\n  - path: /var/tmp/owner-marker\n    content: \"mine\\n\"\n"

// withOwnCloudInit gives vm the owner's inline cloud-config in a NoCloud
// volume of its own.
func withOwnCloudInit(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	vm.Spec.Template.Spec.Volumes = append(vm.Spec.Template.Spec.Volumes, kubevirtv1.Volume{
		Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: ownCloudConfig}},
	})
	vm.Spec.Template.Spec.Domain.Devices.Disks = append(vm.Spec.Template.Spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: "cloudinit"})
	return vm
}

// What the owner wrote is theirs (docs/design.md, decision 17): whatever they
// remove, their cloud-init comes back as it was; a copy gets an identity
// of its own; the audit is where an admin looks.
var _ = Describe("The owner's VM, with the webhook and the controller", Ordered, func() {
	var (
		ctx context.Context
		bed *webhookBed
	)
	update := func(name string, f func(*kubevirtv1.VirtualMachine)) error {
		_, err := bed.update(ctx, name, f)
		return err
	}
	ownPartOf := func(name string) string {
		GinkgoHelper()
		s, err := bed.secretOf(ctx, name)()
		Expect(err).NotTo(HaveOccurred())
		part, err := cloudinit.UserPart(s.Data[v1alpha1.SecretKeyUserData])
		Expect(err).NotTo(HaveOccurred())
		return string(part)
	}
	merged := func(name string) {
		GinkgoHelper()
		vm := bed.getVM(ctx, name)
		Expect(vm.Annotations).To(HaveKey(v1alpha1.AnnotationStatus))
		Expect(vm.Spec.Template.Spec.Volumes).To(HaveLen(2), "no second cloud-init volume, no disk")
		Expect(vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud.UserDataSecretRef).NotTo(BeNil())
		Expect(vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud.UserDataSecretRef.Name).To(Equal(mutate.SecretName(name)))
		Expect(ownPartOf(name)).To(Equal(ownCloudConfig))
	}
	ownBack := func(name string) {
		GinkgoHelper()
		vm := bed.getVM(ctx, name)
		Expect(vm.Annotations).NotTo(HaveKey(v1alpha1.AnnotationStatus))
		Expect(vm.Spec.Template.Spec.Volumes).To(HaveLen(2))
		Expect(vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud).To(Equal(&kubevirtv1.CloudInitNoCloudSource{UserData: ownCloudConfig}))
		Expect(vm.Spec.Template.Spec.Domain.Devices.Disks).To(HaveLen(2))
	}

	// describe is `kubectl describe vm <name>` in team-a, by kubectl's own
	// code: its Events are those with the VM's UID.
	describeVM := func(name string) func() (string, error) {
		return func() (string, error) {
			mapping, err := bed.api.Client.RESTMapper().RESTMapping(kubevirtv1.VirtualMachineGroupVersionKind.GroupKind(), kubevirtv1.GroupVersion.Version)
			if err != nil {
				return "", err
			}
			d, ok := describe.DescriberFor(mapping.GroupVersionKind.GroupKind(), bed.api.Config)
			if !ok {
				if d, ok = describe.GenericDescriberFor(mapping, bed.api.Config); !ok {
					return "", fmt.Errorf("kubectl has no describer for %s", mapping.GroupVersionKind)
				}
			}
			return d.Describe("team-a", name, describe.DescriberSettings{ShowEvents: true, ChunkSize: 500})
		}
	}

	BeforeAll(func() {
		ctx = context.Background()
		bed = startWebhookBed(ctx, webhookBedOptions{Setup: func(mgr ctrl.Manager) error {
			if err := (&credentials.Hasher{Client: mgr.GetClient()}).SetupWithManager(mgr, 2); err != nil {
				return err
			}
			// A short settle time, so that a revocation is seen soon.
			return (&credentials.VMReconciler{SettleTime: settleTime}).SetupWithManager(mgr)
		}}).tenant(ctx, "team-a", "backup")
	})

	It("shows an admin the credentials issued to a VM created with the annotation, in kubectl describe", func() {
		Expect(bed.api.Client.Create(ctx, bed.optIn(story.TypicalVM("described")))).To(Succeed())
		Eventually(describeVM("described")).WithTimeout(30 * time.Second).Should(And(
			MatchRegexp(`Normal\s+CredentialsIssued\s+.*Issued Kopia credentials for described@team-a on BackupStorageLocationServer backup/main \(generation 1, cloud-init mode, Secret described-guestbackup\)`),
		))
		s, err := bed.secretOf(ctx, "described")()
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Annotations).NotTo(HaveKey(vmsecret.AnnotationIssuedEvent))

		By("and those of a VM annotated later")
		plain := story.TypicalVM("later")
		plain.Namespace, plain.Annotations = "team-a", nil
		plain.Spec.Template.Spec.Volumes = plain.Spec.Template.Spec.Volumes[:1]
		plain.Spec.Template.Spec.Domain.Devices.Disks = plain.Spec.Template.Spec.Domain.Devices.Disks[:1]
		Expect(bed.api.Client.Create(ctx, plain)).To(Succeed())
		Expect(update("later", func(vm *kubevirtv1.VirtualMachine) {
			vm.Annotations = map[string]string{v1alpha1.AnnotationServer: "backup/main"}
		})).To(Succeed())
		Eventually(describeVM("later")).WithTimeout(30 * time.Second).Should(MatchRegexp(`Normal\s+CredentialsIssued\s+.*Issued Kopia credentials for later@team-a`))
	})

	It("gives a copy of an injected VM (get -o yaml, rename, apply) its own credentials, Secret and Events, and the owner's cloud-config", func() {
		Expect(bed.api.Client.Create(ctx, withOwnCloudInit(bed.optIn(story.TypicalVM("source"))))).To(Succeed())
		merged("source")
		sourceSecret, err := bed.secretOf(ctx, "source")()
		Expect(err).NotTo(HaveOccurred())
		Eventually(describeVM("source")).WithTimeout(30 * time.Second).Should(ContainSubstring("CredentialsIssued"))

		By("copying it as kubectl get -o yaml, a rename and kubectl apply do")
		clone := bed.getVM(ctx, "source").DeepCopy()
		clone.ObjectMeta = metav1.ObjectMeta{Name: "clone", Namespace: "team-a", Annotations: clone.Annotations, Labels: clone.Labels}
		clone.Status = kubevirtv1.VirtualMachineStatus{}
		Expect(clone.Annotations).To(HaveKey(v1alpha1.AnnotationStatus), "the copy carries the source's status")
		Expect(bed.api.Client.Create(ctx, clone)).To(Succeed())
		merged("clone")
		cloneSecret, err := bed.secretOf(ctx, "clone")()
		Expect(err).NotTo(HaveOccurred())
		Expect(cloneSecret.Data[v1alpha1.SecretKeyPassword]).NotTo(Equal(sourceSecret.Data[v1alpha1.SecretKeyPassword]))
		Expect(string(cloneSecret.Data[v1alpha1.SecretKeyUsername])).To(Equal("clone@team-a"))
		var st v1alpha1.InjectionStatus
		Expect(json.Unmarshal([]byte(bed.getVM(ctx, "clone").Annotations[v1alpha1.AnnotationStatus]), &st)).To(Succeed())
		Expect(st.Secret).To(Equal("clone-guestbackup"))
		Expect(st.User).To(Equal("clone@team-a"))
		Eventually(describeVM("clone")).WithTimeout(30 * time.Second).Should(MatchRegexp(`Normal\s+CredentialsIssued\s+.*Issued Kopia credentials for clone@team-a`))

		By("leaving the source's Secret and Events alone")
		after, err := bed.secretOf(ctx, "source")()
		Expect(err).NotTo(HaveOccurred())
		for _, key := range []string{v1alpha1.SecretKeyUsername, v1alpha1.SecretKeyPassword, v1alpha1.SecretKeyGeneration, v1alpha1.SecretKeyUserData} {
			Expect(after.Data[key]).To(Equal(sourceSecret.Data[key]), key)
		}
		Expect(describeVM("source")()).NotTo(ContainSubstring("clone"))
	})

	It("tells the owner of a guest that reads no NoCloud (Windows, Ignition) what to do", func() {
		windows := bed.optIn(story.TypicalVM("windows"))
		windows.Spec.Template.Spec.Volumes = append(windows.Spec.Template.Spec.Volumes, kubevirtv1.Volume{
			Name: "sysprep", VolumeSource: kubevirtv1.VolumeSource{Sysprep: &kubevirtv1.SysprepSource{Secret: &corev1.LocalObjectReference{Name: "answers"}}},
		})
		windows.Spec.Template.Spec.Domain.Devices.Disks = append(windows.Spec.Template.Spec.Domain.Devices.Disks, kubevirtv1.Disk{
			Name: "sysprep", DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{Bus: kubevirtv1.DiskBusSATA}},
		})
		Expect(bed.api.Client.Create(ctx, windows)).To(MatchError(ContainSubstring("is configured by sysprep (volume sysprep): guestbackup bootstraps Linux guests through cloud-init or a disk its unit reads, and a Windows guest reads neither; remove annotation guestbackup.io/server")))

		coreos := bed.optIn(story.TypicalVM("coreos"))
		coreos.Spec.Template.ObjectMeta.Annotations = map[string]string{kubevirtv1.IgnitionAnnotation: `{"ignition":{"version":"3.3.0"}}`}
		Expect(bed.api.Client.Create(ctx, coreos)).To(MatchError(ContainSubstring("is configured by Ignition (annotation kubevirt.io/ignitiondata of spec.template), which reads no NoCloud volume: install guestbackup's disk unit through your Ignition config")))
		coreos.Annotations[v1alpha1.AnnotationMode] = v1alpha1.ModeDisk
		Expect(bed.api.Client.Create(ctx, coreos)).To(Succeed())
		Expect(bed.getVM(ctx, "coreos").Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Name", mutate.DiskVolume)))
	})

	It("puts the status back when only it is removed, keeping the owner's cloud-config", func() {
		Expect(bed.api.Client.Create(ctx, withOwnCloudInit(bed.optIn(story.TypicalVM("keep"))))).To(Succeed())
		merged("keep")
		Expect(update("keep", func(vm *kubevirtv1.VirtualMachine) { delete(vm.Annotations, v1alpha1.AnnotationStatus) })).To(Succeed())
		merged("keep")

		By("and gives it back when the VM then opts out")
		Expect(update("keep", func(vm *kubevirtv1.VirtualMachine) { delete(vm.Annotations, v1alpha1.AnnotationServer) })).To(Succeed())
		ownBack("keep")
	})

	It("gives the owner's cloud-config back when both annotations go in one update", func() {
		Expect(bed.api.Client.Create(ctx, withOwnCloudInit(bed.optIn(story.TypicalVM("both"))))).To(Succeed())
		merged("both")
		Expect(update("both", func(vm *kubevirtv1.VirtualMachine) {
			delete(vm.Annotations, v1alpha1.AnnotationServer)
			delete(vm.Annotations, v1alpha1.AnnotationStatus)
		})).To(Succeed())
		ownBack("both")
		Eventually(func() bool {
			_, err := bed.secretOf(ctx, "both")()
			return apierrors.IsNotFound(err)
		}).WithTimeout(settleTime+30*time.Second).Should(BeTrue(), "the controller revokes the user once no volume reads the Secret")
	})
})
