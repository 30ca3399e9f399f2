package kopiaserver

import (
	"context"
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

// The rule to read GuestSnapshots is package requeststatus's: the chart
// grants it with the requests' API (requests.enabled).

// QueueRequests are the GuestSnapshots a server's guests are to carry out:
// those the request reconciler admitted (Pending) or a guest started
// (Running), of a VM whose user is in users, as userset.SnapshotRequest
// makes them; one it refuses is left out (the request reconciler fails it).
func QueueRequests(snapshots []v1alpha1.GuestSnapshot, vms map[types.NamespacedName]*metav1.PartialObjectMetadata, users UserSet) []userset.Queued {
	var queued []userset.Queued
	for i := range snapshots {
		s := &snapshots[i]
		if s.Status.Phase != v1alpha1.PhasePending && s.Status.Phase != v1alpha1.PhaseRunning {
			continue
		}
		vm := vms[types.NamespacedName{Namespace: s.Namespace, Name: s.Spec.VM}]
		if vm == nil {
			continue
		}
		user := identity.OfVM(s.Spec.VM, s.Namespace)
		if _, ok := users.Shards[userset.ShardOf(user)][user]; !ok {
			continue
		}
		r, err := cloudinit.SnapshotRequest(s, vm.Annotations)
		if err != nil {
			continue
		}
		queued = append(queued, userset.Queued{Request: r, Order: s.CreationTimestamp.UTC().Format(time.RFC3339) + "/" + s.Name})
	}
	return queued
}

// listRequests lists the GuestSnapshots when the reconciler carries
// requests, else none.
func (r *Reconciler) listRequests(ctx context.Context) ([]v1alpha1.GuestSnapshot, error) {
	if !r.Requests {
		return nil, nil
	}
	list := &v1alpha1.GuestSnapshotList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// bslsOfRequest maps a GuestSnapshot to the BSLS its VM's annotation names.
func (r *Reconciler) bslsOfRequest(ctx context.Context, o client.Object) []reconcile.Request {
	s, ok := o.(*v1alpha1.GuestSnapshot)
	if !ok {
		return nil
	}
	vm := &metav1.PartialObjectMetadata{}
	vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Spec.VM}, vm); err != nil {
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
