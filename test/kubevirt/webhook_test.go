package kubevirt

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
	"github.com/guestbackup/guestbackup/test/story"
)

// webhookSpecs: what the webhook admits, and how, on a tenant (team-a,
// backup/main) of the bed shared.
func webhookSpecs(shared func() *webhookBed) bool {
	return Describe("The admission webhook, registered in a real API server", Ordered, func() {
		var (
			ctx         context.Context
			bed         *webhookBed
			api         *testbed.APIServer
			requests    *counting
			metricsAddr string
			// admissionsBefore is the count by outcome before this
			// tenant's first admission: the counter is the process's, and
			// every bed's webhook counts into it.
			admissionsBefore = map[string]float64{}
		)
		// admissions is the webhook's count of admissions with outcome so
		// far; none while the series was never counted.
		admissions := func(outcome string) float64 {
			GinkgoHelper()
			n, err := testbed.Metric(metricsAddr, "guestbackup_webhook_admissions_total", map[string]string{"outcome": outcome})
			if errors.Is(err, testbed.ErrNoSeries) {
				return 0
			}
			Expect(err).NotTo(HaveOccurred())
			return n
		}
		getVM := func(name string) *kubevirtv1.VirtualMachine { GinkgoHelper(); return bed.getVM(ctx, name) }
		secretOf := func(name string) func() (*corev1.Secret, error) { return bed.secretOf(ctx, name) }
		vmEvents := func(name string) func() ([]string, error) { return bed.vmEvents(ctx, name) }

		BeforeAll(func() {
			ctx = context.Background()
			bed = shared().tenant(ctx, "team-a", "backup")
			api, requests, metricsAddr = bed.api, bed.requests, bed.metricsAddr
			for _, outcome := range []string{"issued", "unchanged", "denied", "removed"} {
				admissionsBefore[outcome] = admissions(outcome)
			}
		})

		It("stores an opted-in VM mutated, with its credentials in a Secret and cloud-init reading them", func() {
			Expect(api.Client.Create(ctx, bed.optIn(story.TypicalVM("web")))).To(Succeed())
			vm := getVM("web")
			Expect(vm.Spec.Template.Spec.Volumes).To(ContainElement(And(
				HaveField("Name", mutate.CloudInitVolume),
				HaveField("CloudInitNoCloud.UserDataSecretRef.Name", "web-guestbackup"))))
			Expect(vm.Spec.Template.Spec.Domain.Devices.Disks).To(ContainElement(HaveField("Name", mutate.CloudInitVolume)))
			Expect(vm.Spec.Template.Spec.Domain.Devices.Interfaces).To(HaveLen(1), "the VM's own fields stay")
			var st v1alpha1.InjectionStatus
			Expect(json.Unmarshal([]byte(vm.Annotations[v1alpha1.AnnotationStatus]), &st)).To(Succeed())
			Expect(st).To(Equal(v1alpha1.InjectionStatus{Mode: "cloud-init", Server: "backup/main", Secret: "web-guestbackup", User: "web@team-a", Generation: 1, Volume: mutate.CloudInitVolume, Disk: mutate.CloudInitVolume}))
			Expect(vm.Annotations[v1alpha1.AnnotationStatus]).NotTo(ContainSubstring("password"))

			s, err := secretOf("web")()
			Expect(err).NotTo(HaveOccurred())
			Expect(s.Labels).To(HaveKeyWithValue(v1alpha1.LabelServerName, "main"))
			Expect(string(s.Data[v1alpha1.SecretKeyUsername])).To(Equal("web@team-a"))
			Expect(len(s.Data[v1alpha1.SecretKeyPassword])).To(BeNumerically(">=", 43))
			Expect(testbed.ValidateCloudConfig(GinkgoT(), s.Data[v1alpha1.SecretKeyUserData])).To(Succeed())
			Expect(string(s.Data[v1alpha1.SecretKeyUserData])).To(ContainSubstring(string(s.Data[v1alpha1.SecretKeyPassword])))
			// The VM had no UID at admission: its CredentialsIssued Event
			// waits in the Secret for the controller (owner_test.go).
			Expect(s.Annotations).To(HaveKeyWithValue(vmsecret.AnnotationIssuedEvent, HavePrefix("Issued Kopia credentials for web@team-a on BackupStorageLocationServer backup/main")))
		})

		It("changes nothing when the VM is admitted again", func() {
			secretBefore, err := secretOf("web")()
			Expect(err).NotTo(HaveOccurred())
			// A new disk: an edit of what the webhook injects into reaches it.
			seen := requests.n.Load()
			before, err := bed.update(ctx, "web", func(vm *kubevirtv1.VirtualMachine) {
				vm.Spec.Template.Spec.Volumes = append(vm.Spec.Template.Spec.Volumes, kubevirtv1.Volume{
					Name: "data", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/data:1"}},
				})
				vm.Spec.Template.Spec.Domain.Devices.Disks = append(vm.Spec.Template.Spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: "data"})
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(requests.n.Load()).To(BeNumerically(">", seen), "the edit reached the webhook")
			after := getVM("web")
			Expect(after.Spec).To(Equal(before.Spec))
			Expect(after.Annotations).To(Equal(before.Annotations))
			secretAfter, err := secretOf("web")()
			Expect(err).NotTo(HaveOccurred())
			Expect(secretAfter.ResourceVersion).To(Equal(secretBefore.ResourceVersion))
		})

		It("never sees a VM that did not opt in", func() {
			seen := requests.n.Load()
			plain := story.TypicalVM("plain")
			plain.Namespace, plain.Annotations = bed.namespace, nil
			Expect(api.Client.Create(ctx, plain)).To(Succeed())
			Expect(getVM("plain").Spec).To(Equal(plain.Spec))
			Expect(requests.n.Load()).To(Equal(seen))
			_, err := secretOf("plain")()
			Expect(apierrors.IsNotFound(err)).To(BeTrue())
		})

		It("writes no Secret on a dry run, yet shows the mutation", func() {
			vm := bed.optIn(story.TypicalVM("dry"))
			Expect(api.Client.Create(ctx, vm, client.DryRunAll)).To(Succeed())
			Expect(vm.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Name", mutate.CloudInitVolume)))
			Consistently(func() bool {
				_, err := secretOf("dry")()
				return apierrors.IsNotFound(err)
			}).WithTimeout(2 * time.Second).Should(BeTrue())
		})

		It("denies a VM that names a server that does not exist, saying so", func() {
			vm := bed.optIn(story.TypicalVM("lost"))
			vm.Annotations[v1alpha1.AnnotationServer] = "backup/nope"
			err := api.Client.Create(ctx, vm)
			Expect(err).To(MatchError(ContainSubstring("BackupStorageLocationServer backup/nope named by annotation guestbackup.io/server does not exist")))
			Eventually(vmEvents("lost")).Should(ContainElement(HavePrefix("Warning InjectionRefused: BackupStorageLocationServer backup/nope")))
		})

		It("moves a VM's inline cloud-config into the Secret, byte for byte", func() {
			own := "#cloud-config\nwrite_files:\n  - path: /var/tmp/owner-marker\n    content: \"mine\\n\"\n"
			vm := bed.optIn(story.TypicalVM("db"))
			vm.Spec.Template.Spec.Volumes = append(vm.Spec.Template.Spec.Volumes, kubevirtv1.Volume{
				Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: own}},
			})
			vm.Spec.Template.Spec.Domain.Devices.Disks = append(vm.Spec.Template.Spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: "cloudinit"})
			Expect(api.Client.Create(ctx, vm)).To(Succeed())
			stored := getVM("db")
			Expect(stored.Spec.Template.Spec.Volumes).To(HaveLen(2), "no second cloud-init volume")
			Expect(stored.Spec.Template.Spec.Volumes[1].CloudInitNoCloud).To(Equal(&kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "db-guestbackup"}}))
			s, err := secretOf("db")()
			Expect(err).NotTo(HaveOccurred())
			part, err := cloudinit.UserPart(s.Data[v1alpha1.SecretKeyUserData])
			Expect(err).NotTo(HaveOccurred())
			Expect(string(part)).To(Equal(own))

			By("giving it back when the VM opts out")
			_, err = bed.update(ctx, "db", func(vm *kubevirtv1.VirtualMachine) { delete(vm.Annotations, v1alpha1.AnnotationServer) })
			Expect(err).NotTo(HaveOccurred())
			back := getVM("db")
			Expect(back.Annotations).NotTo(HaveKey(v1alpha1.AnnotationStatus))
			Expect(back.Spec.Template.Spec.Volumes[1].CloudInitNoCloud).To(Equal(&kubevirtv1.CloudInitNoCloudSource{UserData: own}))
		})

		It("removes what it added when a VM opts out", func() {
			_, err := bed.update(ctx, "web", func(vm *kubevirtv1.VirtualMachine) { delete(vm.Annotations, v1alpha1.AnnotationServer) })
			Expect(err).NotTo(HaveOccurred())
			after := getVM("web")
			Expect(after.Annotations).NotTo(HaveKey(v1alpha1.AnnotationStatus))
			Expect(after.Spec.Template.Spec.Volumes).NotTo(ContainElement(HaveField("Name", mutate.CloudInitVolume)))
			Expect(after.Spec.Template.Spec.Domain.Devices.Disks).NotTo(ContainElement(HaveField("Name", mutate.CloudInitVolume)))
		})

		It("counts its admissions by outcome on its metrics endpoint", func() {
			for outcome, atLeast := range map[string]float64{"issued": 2, "unchanged": 1, "denied": 1, "removed": 2} {
				Expect(admissions(outcome)-admissionsBefore[outcome]).To(BeNumerically(">=", atLeast), outcome)
			}
		})
	})
}
