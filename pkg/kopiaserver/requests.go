package kopiaserver

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// The rules to read GuestSnapshots and GuestRestores are package
// requeststatus's: the chart grants them with the requests' API
// (requests.enabled).

// Requests are the requests, of both kinds, a server's guests may be
// handed.
type Requests struct {
	Snapshots []v1alpha1.GuestSnapshot
	Restores  []v1alpha1.GuestRestore
}

// QueueRequests are the requests a server's guests are to carry out:
// those the request reconciler admitted (Pending) or a guest started
// (Running), of a VM whose user is in users, as cloudinit.SnapshotRequest
// and userset.RestoreRequest make them; one they refuse is left out (the
// request reconciler fails it).
func QueueRequests(requests Requests, vms map[types.NamespacedName]*metav1.PartialObjectMetadata, users UserSet) []userset.Queued {
	var queued []userset.Queued
	add := func(o *metav1.ObjectMeta, vmName string, phase v1alpha1.RequestPhase, build func(vmAnnotations map[string]string) (userset.Request, error)) {
		if phase != v1alpha1.PhasePending && phase != v1alpha1.PhaseRunning {
			return
		}
		vm := vms[types.NamespacedName{Namespace: o.Namespace, Name: vmName}]
		if vm == nil {
			return
		}
		user := identity.OfVM(vmName, o.Namespace)
		if _, ok := users.Shards[userset.ShardOf(user)][user]; !ok {
			return
		}
		r, err := build(vm.Annotations)
		if err != nil {
			return
		}
		queued = append(queued, userset.Queued{Request: r, Order: o.CreationTimestamp.UTC().Format(time.RFC3339) + "/" + o.Name})
	}
	for i := range requests.Snapshots {
		s := &requests.Snapshots[i]
		add(&s.ObjectMeta, s.Spec.VM, s.Status.Phase, func(a map[string]string) (userset.Request, error) { return cloudinit.SnapshotRequest(s, a) })
	}
	for i := range requests.Restores {
		g := &requests.Restores[i]
		add(&g.ObjectMeta, g.Spec.VM, g.Status.Phase, func(a map[string]string) (userset.Request, error) { return userset.RestoreRequest(g, a) })
	}
	return queued
}

// listRequests lists the GuestSnapshots and GuestRestores when the
// reconciler carries requests, else none.
func (r *Reconciler) listRequests(ctx context.Context) (Requests, error) {
	if !r.Requests {
		return Requests{}, nil
	}
	snapshots := &v1alpha1.GuestSnapshotList{}
	if err := r.Client.List(ctx, snapshots); err != nil {
		return Requests{}, fmt.Errorf("list GuestSnapshots: %w", err)
	}
	restores := &v1alpha1.GuestRestoreList{}
	if err := r.Client.List(ctx, restores); err != nil {
		return Requests{}, fmt.Errorf("list GuestRestores: %w", err)
	}
	return Requests{Snapshots: snapshots.Items, Restores: restores.Items}, nil
}

// bslsOfRequest maps a GuestSnapshot or GuestRestore to the BSLS its VM's
// annotation names.
func (r *Reconciler) bslsOfRequest(ctx context.Context, o client.Object) []reconcile.Request {
	var vmName string
	switch req := o.(type) {
	case *v1alpha1.GuestSnapshot:
		vmName = req.Spec.VM
	case *v1alpha1.GuestRestore:
		vmName = req.Spec.VM
	default:
		return nil
	}
	vm := &metav1.PartialObjectMetadata{}
	vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: o.GetNamespace(), Name: vmName}, vm); err != nil {
		return nil
	}
	return bslsOfVM(ctx, vm)
}

// RequestPollInterval is how often b's guests poll for requests
// (spec.requestPollInterval, or its default).
func RequestPollInterval(b *v1alpha1.BackupStorageLocationServer) time.Duration {
	if d := b.Spec.RequestPollInterval; d != nil && d.Duration > 0 {
		return d.Duration
	}
	return v1alpha1.DefaultRequestPollInterval
}
