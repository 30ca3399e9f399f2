package mutate

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/password"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The webhook reads BSLSs, namespaces and guestbackup's Secrets from its
// cache (so list and watch), and writes only the per-VM Secrets.
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get

// admissionsTotal counts the webhook's admissions by outcome (Decision.Outcome, or error).
var admissionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "guestbackup_webhook_admissions_total",
	Help: "VirtualMachine admissions by the guestbackup webhook, by outcome: ignored, denied, issued, rotated, updated, unchanged, removed or error.",
}, []string{"outcome"})

// outcomeError counts an admission that failed: nothing was decided, or
// what was decided could not be written.
const outcomeError = "error"

func init() {
	metrics.Registry.MustRegister(admissionsTotal)
}

// CacheOptions keep the webhook's cache to the VMs' credential Secrets
// (vmsecret.Selector), of which NewHandler's Handler caches the metadata
// alone: the webhook reads no other Secret, and caching every Secret of the
// cluster, or guestbackup's others (its servers' users, repository
// passwords and keys), would cost memory and widen what a compromise
// exposes. Which field manager wrote what is cached of nothing.
func CacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Label: vmsecret.Selector()},
		},
	}
}

// Path is where the webhook server serves the VirtualMachine mutation.
const Path = "/mutate-kubevirt-io-v1-virtualmachine"

// Handler is the admission webhook for VirtualMachines: it gathers what
// Decide needs, and applies its decision (the Secret, the Events, the patch).
type Handler struct {
	// Cache serves the reads of the steady state (a VM admitted again,
	// nothing to change), of a recently admitted VM without a request to
	// the API server (NewHandler). Nil means every decision is taken on
	// Reader alone.
	Cache client.Reader
	// Reader reads from the API server itself. Whenever a decision would
	// write the Secret, it is taken again on a fresh read: a cached Secret
	// can be older than the one the webhook wrote a moment ago.
	Reader   client.Reader
	Writer   client.Writer
	Recorder record.EventRecorder
}

var _ admission.Handler = (*Handler)(nil)

// NewPassword returns a fresh VM password (pkg/password); its signature is
// Input.NewPassword's, so that tests can give Decide predictable ones.
func NewPassword() (string, error) { return password.New(), nil }

// Handle admits one VirtualMachine CREATE or UPDATE.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Kind.Group != kubevirtv1.GroupVersion.Group || req.Kind.Kind != "VirtualMachine" {
		return admission.Allowed("not a VirtualMachine")
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	// Read once, for what the handler gathers and for each decision.
	read, err := readAdmitted(req.Object.Raw)
	if err != nil {
		admissionsTotal.WithLabelValues(OutcomeDenied).Inc()
		return h.refuse(ctx, req, headOf(req.Object.Raw), fmt.Sprintf("guestbackup cannot read this VirtualMachine: %v", err))
	}
	head := read.vm.ObjectMeta
	name := head.Name
	if name == "" {
		name = req.Name
	}
	if name == "" && head.Annotations[v1alpha1.AnnotationServer] != "" {
		return h.refuse(ctx, req, head, "guestbackup needs the VM's metadata.name to issue its identity: generateName names a VM only after admission")
	}
	first := h.Cache
	if first == nil {
		first = h.Reader
	}
	d, err := h.decide(ctx, req, read, name, first)
	if err == nil && (d.Secret != nil || d.Denied != "") && h.Cache != nil {
		// Writes and denials are decided on the API server's own state.
		d, err = h.decide(ctx, req, read, name, h.Reader)
	}
	if err != nil {
		admissionsTotal.WithLabelValues(outcomeError).Inc()
		return admission.Errored(http.StatusInternalServerError, err)
	}
	dryRun := req.DryRun != nil && *req.DryRun
	if d.Denied != "" {
		admissionsTotal.WithLabelValues(d.Outcome).Inc()
		if !dryRun {
			h.record(req, head, d.Events)
		}
		return admission.Denied(d.Denied)
	}
	if d.Secret != nil && !dryRun {
		if err := h.writeSecret(ctx, d.Secret); err != nil {
			// Nothing was issued or updated: the client retries, and
			// the retry's outcome is the one counted.
			admissionsTotal.WithLabelValues(outcomeError).Inc()
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	admissionsTotal.WithLabelValues(d.Outcome).Inc()
	if !dryRun {
		h.record(req, head, d.Events)
	}
	if len(d.Patch) == 0 {
		return admission.Allowed("")
	}
	return admission.Patched("", d.Patch...)
}

// decide gathers Decide's input through r and decides, on the object as
// read.
func (h *Handler) decide(ctx context.Context, req admission.Request, read *admittedVM, name string, r client.Reader) (Decision, error) {
	in := Input{Object: req.Object.Raw, read: read, Namespace: req.Namespace, NewPassword: NewPassword, Now: time.Now()}
	if req.Operation == admissionv1.Update {
		in.OldObject = req.OldObject.Raw
	}
	if value, ok := read.vm.Annotations[v1alpha1.AnnotationServer]; ok {
		if ref, err := ParseServerRef(value); err == nil {
			server, err := serverFrom(ctx, r, ref, req.Namespace)
			if err != nil {
				return Decision{}, err
			}
			in.Server = server
		}
	}
	if name != "" {
		secret := &corev1.Secret{}
		err := r.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: SecretName(name)}, secret)
		switch {
		case err == nil:
			in.Secret = secret
		case !apierrors.IsNotFound(err):
			return Decision{}, fmt.Errorf("read Secret %s: %w", SecretName(name), err)
		}
	}
	for _, name := range copySources(read.vm) {
		// A copy of an injected VM reads another VM's Secret: Decide
		// gives it its own, taking the owner's user-data from that one.
		s := &corev1.Secret{}
		err := r.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: name}, s)
		switch {
		case err == nil:
			if in.Sources == nil {
				in.Sources = map[string]*corev1.Secret{}
			}
			in.Sources[name] = s
		case !apierrors.IsNotFound(err):
			return Decision{}, fmt.Errorf("read Secret %s: %w", name, err)
		}
	}
	if in.Secret != nil && req.Operation == admissionv1.Create {
		// Only then could a CREATE the API server will refuse change
		// anything: the credentials of the VM that already has the name.
		exists, err := h.vmExists(ctx, req.Namespace, name)
		if err != nil {
			return Decision{}, err
		}
		in.AlreadyExists = exists
	}
	return Decide(in)
}

// vmExists asks the API server (never a cache: a VM just deleted must not
// block its re-creation) whether VirtualMachine namespace/name exists. It
// reads metadata only.
func (h *Handler) vmExists(ctx context.Context, namespace, name string) (bool, error) {
	vm := &metav1.PartialObjectMetadata{}
	vm.SetGroupVersionKind(kubevirtv1.GroupVersion.WithKind("VirtualMachine"))
	err := h.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, vm)
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("read VirtualMachine %s/%s: %w", namespace, name, err)
	}
}

func (h *Handler) refuse(ctx context.Context, req admission.Request, m metav1.ObjectMeta, msg string) admission.Response {
	if req.DryRun == nil || !*req.DryRun {
		h.record(req, m, []vmevent.Event{vmevent.Warning(ReasonInjectionRefused, msg)})
	}
	log.FromContext(ctx).Info("VirtualMachine refused", "namespace", req.Namespace, "reason", msg)
	return admission.Denied(msg)
}

// serverFrom finds the BSLS and whether namespace may use it.
func serverFrom(ctx context.Context, r client.Reader, ref types.NamespacedName, namespace string) (Server, error) {
	bsls := &v1alpha1.BackupStorageLocationServer{}
	if err := r.Get(ctx, ref, bsls); err != nil {
		if apierrors.IsNotFound(err) {
			return Server{}, nil
		}
		return Server{}, fmt.Errorf("read BackupStorageLocationServer %s: %w", ref, err)
	}
	s := Server{BSLS: bsls}
	sel := bsls.Spec.Access.NamespaceSelector
	if sel == nil {
		s.NamespaceAllowed = namespace == bsls.Namespace
		return s, nil
	}
	selector, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		// The BSLS controller reports the broken selector; no VM is admitted by it.
		return s, nil
	}
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, types.NamespacedName{Name: namespace}, ns); err != nil {
		return Server{}, fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	s.NamespaceAllowed = selector.Matches(labels.Set(ns.Labels))
	return s, nil
}

// writeSecret creates the Secret, or updates the one Decide started from;
// a conflict fails the admission, and the client's retry decides again.
func (h *Handler) writeSecret(ctx context.Context, s *corev1.Secret) error {
	if s.ResourceVersion == "" {
		if err := h.Writer.Create(ctx, s); err != nil {
			return fmt.Errorf("create Secret %s: %w", s.Name, err)
		}
		return nil
	}
	if err := h.Writer.Update(ctx, s); err != nil {
		return fmt.Errorf("update Secret %s: %w", s.Name, err)
	}
	return nil
}

// record puts events on the VM, by reference: on CREATE it has no UID yet.
func (h *Handler) record(req admission.Request, m metav1.ObjectMeta, events []vmevent.Event) {
	if m.Name == "" {
		m.Name = req.Name
	}
	m.Namespace = req.Namespace
	vmevent.Record(h.Recorder, m, events)
}

// SetupWithManager serves NewHandler's Handler at Path on the manager's
// webhook server, reading from the manager's cache and the API server, and
// recording Events as guestbackup-webhook. The manager's cache must be set
// up with CacheOptions.
func SetupWithManager(mgr ctrl.Manager) {
	mgr.GetWebhookServer().Register(Path, &admission.Webhook{Handler: NewHandler(
		mgr.GetClient(), mgr.GetAPIReader(), mgr.GetClient(), mgr.GetEventRecorderFor("guestbackup-webhook"),
	)})
}
