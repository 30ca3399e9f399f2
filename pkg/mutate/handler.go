package mutate

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// The webhook reads straight from the API server (no cache, so no list or
// watch) and writes only the per-VM Secrets.
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers,verbs=get
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Path is where the webhook server serves the VirtualMachine mutation.
const Path = "/mutate-kubevirt-io-v1-virtualmachine"

// Handler is the admission webhook for VirtualMachines: it gathers what
// Decide needs, and applies its decision (the Secret, the Events, the patch).
type Handler struct {
	// Reader reads BSLSs, namespaces and Secrets; Writer writes Secrets.
	// Reads go straight to the API server: a cached Secret could be older
	// than the one the webhook itself wrote a moment ago.
	Reader   client.Reader
	Writer   client.Writer
	Recorder record.EventRecorder
}

var _ admission.Handler = (*Handler)(nil)

// NewPassword returns 256 random bits, URL-safe base64 encoded.
func NewPassword() (string, error) {
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("read random bytes: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(buf), nil
}

// Handle admits one VirtualMachine CREATE or UPDATE.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Kind.Group != kubevirtv1.GroupVersion.Group || req.Kind.Kind != "VirtualMachine" {
		return admission.Allowed("not a VirtualMachine")
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	var head struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(req.Object.Raw, &head); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	name := head.Metadata.Name
	if name == "" {
		name = req.Name
	}
	if name == "" && head.Metadata.Annotations[v1alpha1.AnnotationServer] != "" {
		return h.refuse(ctx, req, head.Metadata, "guestbackup needs the VM's metadata.name to issue its identity: generateName names a VM only after admission")
	}
	in := Input{Object: req.Object.Raw, Namespace: req.Namespace, NewPassword: NewPassword}
	if value, ok := head.Metadata.Annotations[v1alpha1.AnnotationServer]; ok {
		if ref, err := ParseServerRef(value); err == nil {
			server, err := h.server(ctx, ref, req.Namespace)
			if err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
			in.Server = server
		}
	}
	if name != "" {
		secret := &corev1.Secret{}
		err := h.Reader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: SecretName(name)}, secret)
		switch {
		case err == nil:
			in.Secret = secret
		case !apierrors.IsNotFound(err):
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("read Secret %s: %w", SecretName(name), err))
		}
	}
	d, err := Decide(in)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	dryRun := req.DryRun != nil && *req.DryRun
	if d.Denied != "" {
		if !dryRun {
			h.record(req, head.Metadata, d.Events)
		}
		return admission.Denied(d.Denied)
	}
	if d.Secret != nil && !dryRun {
		if err := h.writeSecret(ctx, d.Secret); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	if !dryRun {
		h.record(req, head.Metadata, d.Events)
	}
	if len(d.Patch) == 0 {
		return admission.Allowed("")
	}
	return admission.Patched("", d.Patch...)
}

func (h *Handler) refuse(ctx context.Context, req admission.Request, m metav1.ObjectMeta, msg string) admission.Response {
	if req.DryRun == nil || !*req.DryRun {
		h.record(req, m, []Event{{corev1.EventTypeWarning, ReasonInjectionRefused, msg}})
	}
	log.FromContext(ctx).Info("VirtualMachine refused", "namespace", req.Namespace, "reason", msg)
	return admission.Denied(msg)
}

// server finds the BSLS and whether namespace may use it.
func (h *Handler) server(ctx context.Context, ref types.NamespacedName, namespace string) (Server, error) {
	bsls := &v1alpha1.BackupStorageLocationServer{}
	if err := h.Reader.Get(ctx, ref, bsls); err != nil {
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
	if err := h.Reader.Get(ctx, types.NamespacedName{Name: namespace}, ns); err != nil {
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
func (h *Handler) record(req admission.Request, m metav1.ObjectMeta, events []Event) {
	if h.Recorder == nil || len(events) == 0 {
		return
	}
	name := m.Name
	if name == "" {
		name = req.Name
	}
	vm := &kubevirtv1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: req.Namespace, UID: m.UID},
	}
	for _, e := range events {
		h.Recorder.Event(vm, e.Type, e.Reason, e.Message)
	}
}

// SetupWithManager serves the Handler at Path on the manager's webhook
// server, reading straight from the API server and recording Events as
// guestbackup-webhook.
func SetupWithManager(mgr ctrl.Manager) {
	mgr.GetWebhookServer().Register(Path, &admission.Webhook{Handler: &Handler{
		Reader:   mgr.GetAPIReader(),
		Writer:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorderFor("guestbackup-webhook"),
	}})
}
