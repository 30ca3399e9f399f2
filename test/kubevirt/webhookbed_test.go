package kubevirt

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// counting counts the admission requests that reach the webhook server,
// and plays an outage (every request answered 503) while down is set.
type counting struct {
	next http.Handler
	n    atomic.Int64
	down atomic.Bool
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	if c.down.Load() {
		http.Error(w, "the webhook is down", http.StatusServiceUnavailable)
		return
	}
	c.next.ServeHTTP(w, r)
}

// webhookBed is a real API server and KubeVirt's control plane with
// guestbackup's webhook configuration, the webhook's handler (cmd/webhook's
// wiring, behind a counter) and, when asked, the controller's VM
// reconciler. A tenant of it (tenant) has a namespace for its VMs and a BSLS
// <bslsNamespace>/main of its own, with the status a Ready BSLS has.
type webhookBed struct {
	platform    *local.Platform
	api         *testbed.APIServer
	requests    *counting
	metricsAddr string
	// namespace is the tenant's VMs'; bslsNamespace its BSLS's.
	namespace, bslsNamespace string
}

// webhookBedOptions adjust startWebhookBed.
type webhookBedOptions struct {
	// Setup registers more of guestbackup with the manager.
	Setup func(ctrl.Manager) error
}

func startWebhookBed(ctx context.Context, o webhookBedOptions) *webhookBed {
	GinkgoHelper()
	b := &webhookBed{}
	b.platform = local.Start(GinkgoT(), local.Options{Logger: GinkgoLogr, Setup: func(mgr ctrl.Manager) error {
		b.requests = &counting{next: &admission.Webhook{Handler: mutate.NewHandler(
			mgr.GetClient(), mgr.GetAPIReader(), mgr.GetClient(), mgr.GetEventRecorderFor("guestbackup-webhook"),
		)}}
		mgr.GetWebhookServer().Register(mutate.Path, b.requests)
		if o.Setup != nil {
			return o.Setup(mgr)
		}
		return nil
	}})
	b.api, b.metricsAddr = b.platform.API, b.platform.MetricsAddr
	return b
}

// tenant is b for VMs in namespace that back up to BSLS
// <bslsNamespace>/main: it creates both namespaces, labelled as the BSLS
// admits them, and the BSLS, Ready. Tenants of one bed share nothing else
// of the API server.
func (b *webhookBed) tenant(ctx context.Context, namespace, bslsNamespace string) *webhookBed {
	GinkgoHelper()
	t := *b
	t.namespace, t.bslsNamespace = namespace, bslsNamespace
	for _, ns := range []string{bslsNamespace, namespace} {
		Expect(b.api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"backup": "allowed"}}})).To(Succeed())
	}
	t.createServer(ctx)
	return &t
}

// server is the tenant's BSLS, as a VM's annotation names it.
func (b *webhookBed) server() string { return b.bslsNamespace + "/main" }

// createServer creates the tenant's BSLS, admitting the namespaces
// labelled backup=allowed, with the status of a Ready BSLS.
func (b *webhookBed) createServer(ctx context.Context) {
	GinkgoHelper()
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: b.bslsNamespace},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
			Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "allowed"}}},
		},
	}
	Expect(b.api.Client.Create(ctx, bsls)).To(Succeed())
	b.setServerStatus(ctx, metav1.ConditionTrue, "Ready", "ready")
}

// setServerStatus gives the tenant's BSLS the status the BSLS controller writes
// (its own specs prove it writes exactly these fields), with an endpoint
// and a CA, and Ready as given.
func (b *webhookBed) setServerStatus(ctx context.Context, ready metav1.ConditionStatus, reason, message string) {
	GinkgoHelper()
	ca, err := pki.NewCA("webhook spec CA", time.Hour)
	Expect(err).NotTo(HaveOccurred())
	bsls := &v1alpha1.BackupStorageLocationServer{}
	Expect(b.api.Client.Get(ctx, types.NamespacedName{Namespace: b.bslsNamespace, Name: "main"}, bsls)).To(Succeed())
	bsls.Status = v1alpha1.BackupStorageLocationServerStatus{
		Endpoint: "https://main." + b.bslsNamespace + ".svc:51515", TLSCA: string(ca.CertPEM()),
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: ready, Reason: reason, Message: message, LastTransitionTime: metav1.Now()}},
	}
	Expect(b.api.Client.Status().Update(ctx, bsls)).To(Succeed())
}

// key names the tenant's VM (or Secret) name.
func (b *webhookBed) key(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: b.namespace, Name: name}
}

func (b *webhookBed) getVM(ctx context.Context, name string) *kubevirtv1.VirtualMachine {
	GinkgoHelper()
	vm := &kubevirtv1.VirtualMachine{}
	Expect(b.api.Client.Get(ctx, b.key(name), vm)).To(Succeed())
	return vm
}

// update changes the stored VM name with f and writes it, as kubectl edit
// does: again on a conflict, since virt-controller writes VMs too. It
// returns the VM as the API server stored it.
func (b *webhookBed) update(ctx context.Context, name string, f func(*kubevirtv1.VirtualMachine)) (*kubevirtv1.VirtualMachine, error) {
	var vm *kubevirtv1.VirtualMachine
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vm = &kubevirtv1.VirtualMachine{}
		if err := b.api.Client.Get(ctx, b.key(name), vm); err != nil {
			return err
		}
		f(vm)
		return b.api.Client.Update(ctx, vm)
	})
	return vm, err
}

func (b *webhookBed) secretOf(ctx context.Context, name string) func() (*corev1.Secret, error) {
	return func() (*corev1.Secret, error) {
		s := &corev1.Secret{}
		return s, b.api.Client.Get(ctx, b.key(mutate.SecretName(name)), s)
	}
}

func (b *webhookBed) vmEvents(ctx context.Context, name string) func() ([]string, error) {
	return func() ([]string, error) { return b.platform.Events(ctx, b.namespace, "VirtualMachine", name) }
}

// optIn makes vm a VM of the tenant that opted in to its BSLS, with only
// its containerDisk.
func (b *webhookBed) optIn(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	return optIn(vm, b.namespace, b.server())
}

// optIn makes vm a VM of namespace that opted in to server
// (<namespace>/<name>), with only its containerDisk.
func optIn(vm *kubevirtv1.VirtualMachine, namespace, server string) *kubevirtv1.VirtualMachine {
	vm.Namespace = namespace
	vm.Annotations = map[string]string{v1alpha1.AnnotationServer: server, v1alpha1.AnnotationPaths: "/etc"}
	vm.Spec.Template.Spec.Volumes = vm.Spec.Template.Spec.Volumes[:1] // the containerDisk only
	vm.Spec.Template.Spec.Domain.Devices.Disks = vm.Spec.Template.Spec.Domain.Devices.Disks[:1]
	return vm
}

// The webhook's own specs wire the same bed, the webhook alone behind a
// counter, so they share one: one API server and KubeVirt's control plane,
// started once, whose KubeVirt witnesses all three at the end. Each is a
// tenant of its own (namespaces and BSLS), and puts back what it turns off
// (the webhook's outage, its BSLS's Ready), so none depends on another's
// state or order. The owner's, the control plane's, the pool's and the CRD's
// specs wire guestbackup otherwise (a controller, cmd/webhook's own wiring,
// a real server, nothing), so they start beds of their own.
var _ = Describe("guestbackup's webhook alone, on one API server and KubeVirt", Ordered, func() {
	var bed *webhookBed
	BeforeAll(func() {
		bed = startWebhookBed(context.Background(), webhookBedOptions{})
	})
	shared := func() *webhookBed { return bed }
	webhookSpecs(shared)
	neverBlocksSpecs(shared)
	gitopsSpecs(shared)
})
