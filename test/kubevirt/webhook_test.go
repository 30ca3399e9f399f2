package kubevirt

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// counting counts the admission requests that reach the webhook server.
type counting struct {
	next http.Handler
	n    atomic.Int64
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	c.next.ServeHTTP(w, r)
}

var _ = Describe("The admission webhook, registered in a real API server", Ordered, func() {
	var (
		ctx         context.Context
		platform    *local.Platform
		api         *testbed.APIServer
		requests    *counting
		metricsAddr string
	)
	vmKey := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "team-a", Name: name} }
	getVM := func(name string) *kubevirtv1.VirtualMachine {
		GinkgoHelper()
		vm := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, vmKey(name), vm)).To(Succeed())
		return vm
	}
	secretOf := func(name string) func() (*corev1.Secret, error) {
		return func() (*corev1.Secret, error) {
			s := &corev1.Secret{}
			return s, api.Client.Get(ctx, vmKey(mutate.SecretName(name)), s)
		}
	}
	vmEvents := func(name string) func() ([]string, error) {
		return func() ([]string, error) { return platform.Events(ctx, "team-a", "VirtualMachine", name) }
	}
	// update changes VM name as its owner would (kubectl edit): again on a
	// conflict, since virt-controller writes the VM too. It returns the VM
	// as the API server answered.
	update := func(name string, change func(*kubevirtv1.VirtualMachine)) *kubevirtv1.VirtualMachine {
		GinkgoHelper()
		var vm *kubevirtv1.VirtualMachine
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			vm = getVM(name)
			change(vm)
			return api.Client.Update(ctx, vm)
		})).To(Succeed())
		return vm
	}
	optIn := func(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
		vm.Namespace = "team-a"
		vm.Annotations = map[string]string{v1alpha1.AnnotationServer: "backup/main", v1alpha1.AnnotationPaths: "/etc"}
		vm.Spec.Template.Spec.Volumes = vm.Spec.Template.Spec.Volumes[:1] // the containerDisk only
		vm.Spec.Template.Spec.Domain.Devices.Disks = vm.Spec.Template.Spec.Domain.Devices.Disks[:1]
		return vm
	}

	BeforeAll(func() {
		ctx = context.Background()
		platform = local.Start(GinkgoT(), local.Options{Logger: GinkgoLogr, Setup: func(mgr ctrl.Manager) error {
			// cmd/webhook's wiring (mutate.SetupWithManager), with a
			// counter in front that sees every request reaching the server.
			requests = &counting{next: &admission.Webhook{Handler: &mutate.Handler{
				Cache: mgr.GetClient(), Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("guestbackup-webhook"),
			}}}
			mgr.GetWebhookServer().Register(mutate.Path, requests)
			return nil
		}})
		api, metricsAddr = platform.API, platform.MetricsAddr

		for _, ns := range []string{"backup", "team-a"} {
			Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"backup": "allowed"}}})).To(Succeed())
		}
		bsls := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
				Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "allowed"}}},
			},
		}
		Expect(api.Client.Create(ctx, bsls)).To(Succeed())
		// The status a Ready BSLS has; the BSLS controller's own specs
		// prove it writes exactly these fields.
		ca, err := pki.NewCA("webhook spec CA", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		bsls.Status = v1alpha1.BackupStorageLocationServerStatus{
			Endpoint: "https://main.backup.svc:51515", TLSCA: string(ca.CertPEM()),
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "ready", LastTransitionTime: metav1.Now()}},
		}
		Expect(api.Client.Status().Update(ctx, bsls)).To(Succeed())
	})

	It("stores an opted-in VM mutated, with its credentials in a Secret and cloud-init reading them", func() {
		Expect(api.Client.Create(ctx, optIn(typicalVM("web")))).To(Succeed())
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
		Eventually(vmEvents("web")).Should(ContainElement(HavePrefix("Normal CredentialsIssued: Issued Kopia credentials for web@team-a on BackupStorageLocationServer backup/main")))
	})

	It("changes nothing when the VM is admitted again", func() {
		secretBefore, err := secretOf("web")()
		Expect(err).NotTo(HaveOccurred())
		before := update("web", func(vm *kubevirtv1.VirtualMachine) { vm.Labels = map[string]string{"tier": "frontend"} })
		after := getVM("web")
		Expect(after.Spec).To(Equal(before.Spec))
		Expect(after.Annotations).To(Equal(before.Annotations))
		secretAfter, err := secretOf("web")()
		Expect(err).NotTo(HaveOccurred())
		Expect(secretAfter.ResourceVersion).To(Equal(secretBefore.ResourceVersion))
	})

	It("never sees a VM that did not opt in", func() {
		seen := requests.n.Load()
		plain := typicalVM("plain")
		plain.Namespace, plain.Annotations = "team-a", nil
		Expect(api.Client.Create(ctx, plain)).To(Succeed())
		Expect(getVM("plain").Spec).To(Equal(plain.Spec))
		Expect(requests.n.Load()).To(Equal(seen))
		_, err := secretOf("plain")()
		Expect(apierrors.IsNotFound(err)).To(BeTrue())
	})

	It("writes no Secret on a dry run, yet shows the mutation", func() {
		vm := optIn(typicalVM("dry"))
		Expect(api.Client.Create(ctx, vm, client.DryRunAll)).To(Succeed())
		Expect(vm.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Name", mutate.CloudInitVolume)))
		Consistently(func() bool {
			_, err := secretOf("dry")()
			return apierrors.IsNotFound(err)
		}).WithTimeout(2 * time.Second).Should(BeTrue())
	})

	It("denies a VM that names a server that does not exist, saying so", func() {
		vm := optIn(typicalVM("lost"))
		vm.Annotations[v1alpha1.AnnotationServer] = "backup/nope"
		err := api.Client.Create(ctx, vm)
		Expect(err).To(MatchError(ContainSubstring("BackupStorageLocationServer backup/nope named by annotation guestbackup.io/server does not exist")))
		Eventually(vmEvents("lost")).Should(ContainElement(HavePrefix("Warning InjectionRefused: BackupStorageLocationServer backup/nope")))
	})

	It("moves a VM's inline cloud-config into the Secret, byte for byte", func() {
		own := "#cloud-config\nwrite_files:\n  - path: /var/tmp/owner-marker\n    content: \"mine\\n\"\n"
		vm := optIn(typicalVM("db"))
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
		update("db", func(vm *kubevirtv1.VirtualMachine) { delete(vm.Annotations, v1alpha1.AnnotationServer) })
		back := getVM("db")
		Expect(back.Annotations).NotTo(HaveKey(v1alpha1.AnnotationStatus))
		Expect(back.Spec.Template.Spec.Volumes[1].CloudInitNoCloud).To(Equal(&kubevirtv1.CloudInitNoCloudSource{UserData: own}))
	})

	It("removes what it added when a VM opts out", func() {
		update("web", func(vm *kubevirtv1.VirtualMachine) { delete(vm.Annotations, v1alpha1.AnnotationServer) })
		after := getVM("web")
		Expect(after.Annotations).NotTo(HaveKey(v1alpha1.AnnotationStatus))
		Expect(after.Spec.Template.Spec.Volumes).NotTo(ContainElement(HaveField("Name", mutate.CloudInitVolume)))
		Expect(after.Spec.Template.Spec.Domain.Devices.Disks).NotTo(ContainElement(HaveField("Name", mutate.CloudInitVolume)))
	})

	It("counts its admissions by outcome on its metrics endpoint", func() {
		for outcome, atLeast := range map[string]float64{"issued": 2, "unchanged": 1, "denied": 1, "removed": 2} {
			Expect(testbed.Metric(metricsAddr, "guestbackup_webhook_admissions_total", map[string]string{"outcome": outcome})).
				To(BeNumerically(">=", atLeast), outcome)
		}
	})
})
