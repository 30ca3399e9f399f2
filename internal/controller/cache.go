package controller

import (
	"maps"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// Cache keeps the controller's cache to guestbackup's own Pods, Jobs,
// ConfigMaps and Secrets (app.kubernetes.io/managed-by=guestbackup): it reconciles no
// others, and caching every Secret of the cluster would hold every
// credential of every tenant in its memory. The few Secrets others own that
// the controller reads (an admin's TLS, S3 or repository password Secret,
// Velero's credentials, cert-manager's serving Secret) it reads uncached
// (kopiaserver.Reconciler.APIReader).
//
// Of what it caches, it keeps what its reconcilers read (transformFor), and
// it lists in pages, each trimmed as it arrives (newInformer): with 10,000
// opted-in VMs, the credential Secrets' payloads, the VMs' kubectl
// last-applied copies and the instances' specs would otherwise be most of
// its memory, and all of them at once while it starts (make bench,
// BenchmarkOptedInVMs).
func Cache() cache.Options {
	managed := labels.SelectorFromSet(labels.Set{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue})
	return cache.Options{
		DefaultTransform: transformFor(schema.GroupKind{}),
		NewInformer:      newInformer,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: managed},
			// Restore Jobs (package requeststatus), in the VMs' namespaces.
			&batchv1.Job{}:      {Label: managed},
			&corev1.ConfigMap{}: {Label: managed},
			&corev1.Secret{}:    {Label: managed, Transform: transformFor(secretKind)},
			// The reconcilers watch VMs as metadata only
			// (builder.OnlyMetadata), and instances whole, trimmed to
			// their metadata and phase: the audit reads the one, the
			// Hasher the other, from the one informer.
			&kubevirtv1.VirtualMachine{}:         {Transform: transformFor(vmKind)},
			&kubevirtv1.VirtualMachineInstance{}: {Transform: transformFor(instanceKind)},
		},
	}
}

var (
	secretKind   = schema.GroupKind{Kind: "Secret"}
	vmKind       = kubevirtv1.VirtualMachineGroupVersionKind.GroupKind()
	instanceKind = kubevirtv1.VirtualMachineInstanceGroupVersionKind.GroupKind()
)

// transformFor is what the cache keeps of objects of kind gk: its trim, or,
// for every other kind, all but the managed fields (which field manager
// wrote which field is read by nothing).
func transformFor(gk schema.GroupKind) toolscache.TransformFunc {
	switch gk {
	case secretKind:
		return TrimSecret
	case vmKind:
		return TrimVM
	case instanceKind:
		return TrimInstance
	}
	return cache.TransformStripManagedFields()
}

// newInformer is an informer that lists in pages, each object trimmed as
// its kind's transform does as its page arrives (manager.PagedInformers).
var newInformer = manager.PagedInformers(Scheme(), transformFor)

// The trims below are the informers' transforms (toolscache.TransformFunc):
// each returns what the cache keeps of an object fresh from the API
// server's list or watch, which it may change; an object of a type it does
// not know passes as it is. Trimming what is trimmed changes nothing, as
// informers require.

// TrimSecret is what the cache keeps of a Secret. Of a credential Secret
// it drops the payload (vmsecret.IsPayloadKey: the user-data or the disk's
// files, which are most of its size): only the bootstrap reconciler reads
// it, and only to render it again, which it does from the Secret it reads
// from the API server. The credentials, the hashes, every label,
// annotation and owner reference stay. Of every Secret it keeps the
// managed fields' times without the fields (the VM reconciler's settle
// time is the last write's time; which fields were written is read by
// nothing).
func TrimSecret(in any) (any, error) {
	s, ok := in.(*corev1.Secret)
	if !ok {
		return in, nil
	}
	trimManagedFields(&s.ObjectMeta)
	if vmsecret.Selector().Matches(labels.Set(s.Labels)) {
		maps.DeleteFunc(s.Data, func(k string, _ []byte) bool { return vmsecret.IsPayloadKey(k) })
	}
	return s, nil
}

// TrimVM is what the cache keeps of a VirtualMachine, which every
// reconciler reads as metadata only: its guestbackup.io annotations (what
// it opted in to, what the webhook injected, what it backs up) and no
// other annotation (kubectl's last-applied copy of the whole VM is the
// largest), no managed fields. Name, namespace, UID, generation, labels,
// owners, creation and deletion stay.
func TrimVM(in any) (any, error) {
	switch vm := in.(type) {
	case *metav1.PartialObjectMetadata:
		trimMetadata(&vm.ObjectMeta)
	case *kubevirtv1.VirtualMachine:
		// Not cached today (VMs are read whole only from the API server);
		// should one be, it is trimmed alike and keeps its spec.
		trimMetadata(&vm.ObjectMeta)
	}
	return in, nil
}

// TrimInstance is what the cache keeps of a VirtualMachineInstance: its
// metadata as TrimVM keeps a VM's (the audit reads its UID and creation and
// deletion times), and, of a whole instance, its phase and phase
// transition times (the Hasher's LauncherStarted) and nothing else of its
// spec or status, which change as it runs.
func TrimInstance(in any) (any, error) {
	switch vmi := in.(type) {
	case *metav1.PartialObjectMetadata:
		trimMetadata(&vmi.ObjectMeta)
	case *kubevirtv1.VirtualMachineInstance:
		trimMetadata(&vmi.ObjectMeta)
		return &kubevirtv1.VirtualMachineInstance{
			TypeMeta:   vmi.TypeMeta,
			ObjectMeta: vmi.ObjectMeta,
			Status: kubevirtv1.VirtualMachineInstanceStatus{
				Phase:                     vmi.Status.Phase,
				PhaseTransitionTimestamps: vmi.Status.PhaseTransitionTimestamps,
			},
		}, nil
	}
	return in, nil
}

// trimMetadata drops the managed fields and every annotation but
// guestbackup's.
func trimMetadata(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	maps.DeleteFunc(m.Annotations, func(k string, _ string) bool { return !strings.HasPrefix(k, v1alpha1.AnnotationPrefix) })
	if len(m.Annotations) == 0 {
		m.Annotations = nil
	}
}

// trimManagedFields keeps who wrote when, without which fields.
func trimManagedFields(m *metav1.ObjectMeta) {
	for i := range m.ManagedFields {
		m.ManagedFields[i].FieldsV1 = nil
	}
}
