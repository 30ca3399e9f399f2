package requests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// The webhook reads the VirtualMachine a request names, metadata only,
// from the API server itself (mutate's marker grants the same).
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get

// Kinds of the requests Handler admits.
const (
	KindGuestSnapshot = "GuestSnapshot"
	KindGuestRestore  = "GuestRestore"
)

// Path is where the webhook server serves the requests' admission.
const Path = "/mutate-guestbackup-io-v1alpha1-requests"

// Handler admits the creation of GuestSnapshots and GuestRestores: it
// reads the VM the request names, decides (ValidateSnapshot,
// ValidateRestore), and either denies with what to fix or stamps the
// requester (RequesterOf) into spec.requester, replacing whatever the
// client sent. Updates never reach it: a CEL rule keeps the spec, the
// requester included, as created.
type Handler struct {
	// Reader reads VMs from the API server, uncached: a VM opted in or
	// granted a moment ago admits a request at once, and the webhook
	// caches no VM of the cluster for it.
	Reader client.Reader
	// Clock is the time a snapshot's "before" is judged at.
	Clock clock.PassiveClock
}

var _ admission.Handler = (*Handler)(nil)

// Handle admits one request CREATE.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Kind.Group != v1alpha1.GroupVersion.Group || req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	var (
		vmName   string
		validate func(vm *VM) []string
		name     string
		err      error
	)
	switch req.Kind.Kind {
	case KindGuestSnapshot:
		var r admitted[v1alpha1.GuestSnapshotSpec]
		err = json.Unmarshal(req.Object.Raw, &r)
		name, vmName = nameOf(r.Metadata.Name, r.Metadata.GenerateName), r.Spec.VM
		validate = func(vm *VM) []string { return ValidateSnapshot(req.Namespace, r.Spec, vm) }
	case KindGuestRestore:
		var r admitted[v1alpha1.GuestRestoreSpec]
		err = json.Unmarshal(req.Object.Raw, &r)
		name, vmName = nameOf(r.Metadata.Name, r.Metadata.GenerateName), r.Spec.VM
		validate = func(vm *VM) []string { return ValidateRestore(req.Namespace, r.Spec, vm, h.Clock.Now()) }
	default:
		return admission.Allowed("")
	}
	if err != nil {
		// Mutating webhooks see a request before the API server checks
		// it against its schema: a value of the wrong form is said here.
		return admission.Denied(Message(req.Kind.Kind, name, []string{Unreadable(err)}))
	}
	vm, err := h.vm(ctx, req.Namespace, vmName)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if problems := validate(vm); len(problems) > 0 {
		msg := Message(req.Kind.Kind, name, problems)
		log.FromContext(ctx).Info("request refused", "namespace", req.Namespace, "kind", req.Kind.Kind, "user", req.UserInfo.Username, "reason", msg)
		return admission.Denied(msg)
	}
	// "add" replaces a member that exists: one operation whatever the
	// client sent, and nothing else of the request is touched.
	return admission.Patched("", jsonpatch.JsonPatchOperation{Operation: "add", Path: "/spec/requester", Value: RequesterOf(req.UserInfo)})
}

// admitted is what the handler reads of a request: its metadata and spec,
// never its status, which the API server drops on creation.
type admitted[Spec any] struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     Spec              `json:"spec"`
}

// vm reads the metadata of VirtualMachine namespace/name; nil when it does
// not exist, or when name could name none (the decision says why).
func (h *Handler) vm(ctx context.Context, namespace, name string) (*VM, error) {
	if checkVMName("", name, namespace) != "" {
		return nil, nil
	}
	vm := &VM{}
	vm.SetGroupVersionKind(kubevirtv1.GroupVersion.WithKind("VirtualMachine"))
	err := h.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, vm)
	switch {
	case err == nil:
		return vm, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	default:
		return nil, fmt.Errorf("read VirtualMachine %s/%s: %w", namespace, name, err)
	}
}

// nameOf names a request in a denial: by its name, or before the API
// server gives it one, by its generateName.
func nameOf(name, generateName string) string {
	if name == "" && generateName != "" {
		return generateName + "*"
	}
	return name
}

// SetupWithManager serves Handler at Path on the manager's webhook server,
// reading VMs from the API server.
func SetupWithManager(mgr ctrl.Manager) {
	mgr.GetWebhookServer().Register(Path, &admission.Webhook{Handler: &Handler{Reader: mgr.GetAPIReader(), Clock: clock.RealClock{}}})
}
