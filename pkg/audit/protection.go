package audit

import (
	"context"
	"fmt"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
)

// +kubebuilder:rbac:groups=guestbackup.io,resources=guestprotections,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=guestbackup.io,resources=guestprotections/status,verbs=update;patch

// Reasons of the GuestProtection conditions.
const (
	// ReasonSnapshotsSeen: the server has snapshots of the guest.
	ReasonSnapshotsSeen = "SnapshotsSeen"
	// ReasonNoSnapshotYet: no snapshot of the guest reached its server yet.
	ReasonNoSnapshotYet = "NoSnapshotYet"
	// ReasonWithinSchedule: the newest snapshot is as recent as the VM's
	// schedule asks.
	ReasonWithinSchedule = "WithinSchedule"
)

// ProtectionInputs is what a VM's GuestProtection status is decided from.
type ProtectionInputs struct {
	// Server is the VM's BSLS; Identity its guest's Kopia user.
	Server, Identity string
	// Guest is the guest's activity on its server; nil when none.
	Guest *activity.Guest
	// Recent is the guest's catalogue on its server, newest first.
	Recent []activity.Snapshot
	// NotConnected: GuestNotConnected is announced for the running
	// instance. Stale: BackupStale is announced.
	NotConnected, Stale bool
	// Current is the status as it is (its conditions keep their
	// transition times); Now stamps the conditions that change.
	Current v1alpha1.GuestProtectionStatus
	Now     time.Time
}

// ProtectionStatus decides a VM's GuestProtection status: what its server
// has of it, and the conditions that sum it up, from the same facts as
// the Events on the VM.
func ProtectionStatus(in ProtectionInputs) v1alpha1.GuestProtectionStatus {
	s := v1alpha1.GuestProtectionStatus{Server: in.Server, Identity: in.Identity, Conditions: append([]metav1.Condition(nil), in.Current.Conditions...)}
	seen := in.Guest != nil && in.Guest.Last.ID != ""
	if seen {
		g := in.Guest
		s.Snapshots = int32(min(g.Snapshots, 1<<31-1))
		if !g.First.IsZero() {
			s.FirstSnapshotTime = ptr.To(stored(g.First))
		}
		s.LastSnapshot = ptr.To(Summary(g.Last))
	}
	for _, snap := range in.Recent[:min(len(in.Recent), v1alpha1.MaxRecentSnapshots)] {
		s.RecentSnapshots = append(s.RecentSnapshots, Summary(snap))
	}
	connected := metav1.Condition{Type: v1alpha1.ConditionGuestConnected, Status: metav1.ConditionUnknown, Reason: ReasonNoSnapshotYet,
		Message: "no snapshot of this guest has reached its server yet"}
	fresh := metav1.Condition{Type: v1alpha1.ConditionBackupFresh, Status: metav1.ConditionUnknown, Reason: ReasonNoSnapshotYet,
		Message: "no snapshot of this guest has reached its server yet"}
	switch {
	case seen:
		connected.Status, connected.Reason = metav1.ConditionTrue, ReasonSnapshotsSeen
		connected.Message = fmt.Sprintf("%s has %d snapshots of this guest (%s)", in.Server, in.Guest.Snapshots, in.Identity)
	case in.NotConnected:
		connected.Status, connected.Reason = metav1.ConditionFalse, ReasonGuestNotConnected
		connected.Message = fmt.Sprintf("the VM runs, but no snapshot of its guest has reached %s: see the VM's %s Event", in.Server, ReasonGuestNotConnected)
	}
	switch {
	case seen && in.Stale:
		fresh.Status, fresh.Reason = metav1.ConditionFalse, ReasonBackupStale
		fresh.Message = fmt.Sprintf("the newest snapshot, of %s, is older than the VM's schedule allows: see the VM's %s Event", s.LastSnapshot.EndTime.UTC().Format(time.RFC3339), ReasonBackupStale)
	case in.Stale:
		fresh.Status, fresh.Reason = metav1.ConditionFalse, ReasonBackupStale
		fresh.Message = fmt.Sprintf("no snapshot of this guest reached its server within the time its schedule allows: see the VM's %s Event", ReasonBackupStale)
	case seen:
		fresh.Status, fresh.Reason = metav1.ConditionTrue, ReasonWithinSchedule
		fresh.Message = fmt.Sprintf("the newest snapshot is of %s", s.LastSnapshot.EndTime.UTC().Format(time.RFC3339))
	}
	for _, c := range []metav1.Condition{connected, fresh} {
		c.LastTransitionTime = stored(in.Now)
		meta.SetStatusCondition(&s.Conditions, c)
	}
	return s
}

// Summary is snap as its owner sees it: in a GuestProtection, and in a
// BackupClient's status (package backupclient).
func Summary(snap activity.Snapshot) v1alpha1.GuestSnapshotSummary {
	return v1alpha1.GuestSnapshotSummary{
		ID: snap.ID, Path: snap.Path, Bytes: snap.Bytes, Files: snap.Files,
		StartTime: stored(snap.Start), EndTime: stored(snap.End),
	}
}

// stored is t as the API server keeps a metav1.Time: whole seconds, UTC,
// so that a status read back compares equal to the one decided again.
func stored(t time.Time) metav1.Time { return metav1.NewTime(t).Rfc3339Copy() }

// protect keeps the VM's GuestProtection: created for an opted-in VM,
// owned by it (so it goes with the VM), its status written only when it
// changes.
func (r *Reconciler) protect(ctx context.Context, vm *metav1.PartialObjectMetadata, in ProtectionInputs) error {
	p := &v1alpha1.GuestProtection{}
	key := types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}
	switch err := r.Client.Get(ctx, key, p); {
	case apierrors.IsNotFound(err):
		p = &v1alpha1.GuestProtection{ObjectMeta: metav1.ObjectMeta{
			Name: vm.Name, Namespace: vm.Namespace,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: kubevirtv1.VirtualMachineGroupVersionKind.GroupVersion().String(), Kind: kubevirtv1.VirtualMachineGroupVersionKind.Kind,
				Name: vm.Name, UID: vm.UID, Controller: ptr.To(true),
			}},
		}}
		if err := r.Client.Create(ctx, p); err != nil {
			return fmt.Errorf("create GuestProtection %s: %w", key, err)
		}
	case err != nil:
		return fmt.Errorf("get GuestProtection %s: %w", key, err)
	case !metav1.IsControlledBy(p, vm):
		// The VM of that name was deleted and made again: its old
		// protection is being collected, and the next pass makes one.
		return r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID})
	}
	in.Current = p.Status
	want := ProtectionStatus(in)
	if apiequality.Semantic.DeepEqual(want, p.Status) {
		return nil
	}
	patch := client.MergeFrom(p.DeepCopy())
	p.Status = want
	if err := r.Client.Status().Patch(ctx, p, patch); err != nil {
		return fmt.Errorf("update the status of GuestProtection %s: %w", key, err)
	}
	return nil
}

// unprotect deletes the GuestProtection of a VM that no longer opts in.
func (r *Reconciler) unprotect(ctx context.Context, key types.NamespacedName) error {
	p := &v1alpha1.GuestProtection{}
	if err := r.Client.Get(ctx, key, p); err != nil {
		return client.IgnoreNotFound(err)
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}))
}
