// Package optimistic writes a change to an object onto the version it was
// computed from, and onto no other.
//
// A JSON merge patch replaces a list (finalizers, ownerReferences) as a
// whole, and a change decided on one read of an object may be wrong for the
// next: written over a newer version, it would drop what another writer
// added since, or apply a decision whose inputs moved. Guarded by the
// resourceVersion it was computed from, the API server refuses it with a
// Conflict instead. client-go's retry.RetryOnConflict would then read and
// change again in the same call; guestbackup's reconcilers instead decide
// again on their next reconcile (a requeue, or the watch event of the
// other write), so what this package adds is the guarded write alone.
package optimistic

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Patch applies change to obj and writes what it changed as a merge patch
// the API server applies only to the resourceVersion obj was read at. On
// success obj is the object as stored. A Conflict (IsConflict) means obj
// changed since it was read; obj then holds the change that was not
// written.
func Patch(ctx context.Context, c client.Writer, obj client.Object, change func()) error {
	base, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		panic("optimistic.Patch: a deep copy of a client.Object is not one")
	}
	change()
	return c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}

// IgnoreConflict is nil for a Conflict and err otherwise, as
// client.IgnoreNotFound is for NotFound: for a write whose caller decides
// again anyway when the object changes.
func IgnoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}
