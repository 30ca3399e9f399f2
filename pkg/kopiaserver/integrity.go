package kopiaserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
)

// integrityDocs is where the condition and the VMs' Events send an admin
// or a VM's owner for what a loss means and what to do; the server pod's
// Events point there too.
const integrityDocs = `docs/operations.md, "Verification"`

// integrityStatus is status.integrity from what the server pod published
// (nil: nothing, so nil), bounded as the state is (a pod that lists more
// is cut short). What the status the previous pass wrote (previous) knew of
// a complete pass is kept, with the failure, when what the pod published
// cannot be read (unreadable) or holds no complete pass (a pod that
// restarted and failed its first pass knows nothing of earlier ones): a
// loss found stays reported, and the VMs' Events are not announced again.
func integrityStatus(s *maintenancestate.IntegrityState, unreadable string, previous *v1alpha1.IntegrityStatus) *v1alpha1.IntegrityStatus {
	switch {
	case unreadable != "":
		st := &v1alpha1.IntegrityStatus{}
		if previous != nil {
			st = previous.DeepCopy()
		}
		st.Failure = unreadable
		return st
	case s == nil:
		return nil
	case s.VerifiedAt.IsZero() && previous != nil && previous.LastVerified != nil:
		st := previous.DeepCopy()
		st.LastChecked, st.Failure = metaTime(s.CheckedAt), s.Error
		return st
	}
	st := &v1alpha1.IntegrityStatus{
		LastChecked:      metaTime(s.CheckedAt),
		LastVerified:     metaTime(s.VerifiedAt),
		Failure:          s.Error,
		Contents:         int64(s.Contents),
		Packs:            int64(s.Packs),
		ReadPacks:        int64(s.ReadPacks),
		ReadBytes:        s.ReadBytes,
		MissingPacks:     bounded(s.MissingPacks, maintenancestate.MaxListedPacks),
		DamagedPacks:     bounded(s.DamagedPacks, maintenancestate.MaxListedPacks),
		LostContents:     int64(s.LostContents),
		PendingContents:  int64(s.Pending),
		DamagedSnapshots: int64(s.DamagedSnapshots),
		DamagedSince:     metaTime(s.DamagedSince),
	}
	st.Damaged = damagedVMs(s.Damaged)
	st.Settled = damagedVMs(s.Settled)
	return st
}

// damagedVMs are sources for the status, bounded as the state is.
func damagedVMs(sources []maintenancestate.DamagedSource) []v1alpha1.DamagedVM {
	var out []v1alpha1.DamagedVM
	for _, d := range bounded(sources, maintenancestate.MaxListedSources) {
		out = append(out, v1alpha1.DamagedVM{
			Namespace: d.Host, Name: d.User, Path: d.Path,
			Snapshots: int64(d.Snapshots), Files: int64(d.Files),
			Oldest: metaTime(d.Oldest), Newest: metaTime(d.Newest),
			IDs:     bounded(d.IDs, maintenancestate.MaxListedSnapshots),
			Healing: d.Healing,
		})
	}
	return out
}

// verificationOff says why b's server pods do not verify the repository:
// maintenance is disabled, or spec.repository.maintenance.verifyInterval
// is 0s; empty when they do.
func verificationOff(b *v1alpha1.BackupStorageLocationServer) string {
	switch m := b.Spec.Repository.Maintenance; {
	case m == nil:
		return ""
	case m.Disabled:
		return "spec.repository.maintenance.disabled is set"
	case m.VerifyInterval != nil && m.VerifyInterval.Duration == 0:
		return "spec.repository.maintenance.verifyInterval is 0s"
	}
	return ""
}

// integrityCondition is RepositoryIntact of BSLS b from its
// status.integrity (integrityStatus; nil: nothing published yet);
// unreadable is true when its failure is that what the server pod
// published cannot be read. A loss the last complete pass found makes it
// False whatever came after; a verification that never completed, whose
// last pass failed, or that is turned off leaves it Unknown, which Ready
// does not wait for.
func integrityCondition(b *v1alpha1.BackupStorageLocationServer, st *v1alpha1.IntegrityStatus, unreadable bool) metav1.Condition {
	cond := func(status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.ConditionRepositoryIntact, Status: status, Reason: reason, Message: msg}
	}
	off := verificationOff(b)
	if st == nil || (st.LastVerified == nil && st.Failure == "") {
		if off != "" {
			return cond(metav1.ConditionUnknown, ReasonNotVerified,
				"Verification is off ("+off+"): nothing checks that the storage still holds the data the repository's index names")
		}
		return cond(metav1.ConditionUnknown, ReasonNotVerified,
			"No verification of the repository is published yet: the server pod that runs maintenance verifies it on its schedule (a server pod of an older guestbackup does not)")
	}
	bsls := b.Name
	failed := ""
	switch {
	case unreadable:
		failed = fmt.Sprintf("what the server pod published of the repository's verification in ConfigMap %s cannot be read (%s)", maintenancestate.ConfigMapName(bsls), st.Failure)
	case st.Failure != "":
		ended := ""
		if st.LastChecked != nil {
			ended = ", ended " + timestamp(st.LastChecked.Time) + ","
		}
		failed = fmt.Sprintf("the last verification%s could not complete: %s", ended, st.Failure)
	}
	if st.LastVerified == nil {
		if unreadable {
			return cond(metav1.ConditionUnknown, ReasonVerificationFailed, capitalize(failed)+": nothing is known of the repository's integrity until the pod publishes it again")
		}
		return cond(metav1.ConditionUnknown, ReasonVerificationFailed, capitalize(failed)+"; no verification has completed yet")
	}
	verified := timestamp(st.LastVerified.Time)
	if damaged(st) {
		msg := lossMessage(st) + " Last complete verification ended " + verified
		if failed != "" {
			msg += "; " + failed
		}
		if off != "" {
			msg += "; verification is off (" + off + "), so nothing says when it heals"
		}
		return cond(metav1.ConditionFalse, ReasonContentsLost, msg+"; see "+integrityDocs)
	}
	found := fmt.Sprintf("all %d contents the index names are in the %d packs the storage holds, and %d packs (%d bytes) read back and decrypted",
		st.Contents, st.Packs, st.ReadPacks, st.ReadBytes)
	if len(st.Settled) > 0 {
		found += "; " + settledMessage(st.Settled)
	}
	if off != "" {
		return cond(metav1.ConditionUnknown, ReasonNotVerified,
			"Verification is off ("+off+"); the last complete one, ended "+verified+", found "+found)
	}
	if failed != "" {
		return cond(metav1.ConditionUnknown, ReasonVerificationFailed, capitalize(failed)+"; the last complete one, ended "+verified+", found "+found)
	}
	return cond(metav1.ConditionTrue, ReasonIntact, "Verified at "+verified+": "+found)
}

// damaged is whether the last complete pass found data lost, or snapshots
// that reference lost data.
func damaged(st *v1alpha1.IntegrityStatus) bool {
	return st.LostContents > 0 || st.DamagedSnapshots > 0 || len(st.Damaged) > 0
}

// lossMessage says what the storage lost, which snapshots of which VMs it
// damages, what still restores and how they heal.
func lossMessage(st *v1alpha1.IntegrityStatus) string {
	var lost []string
	if len(st.MissingPacks) > 0 {
		lost = append(lost, packList(st.MissingPacks)+" missing from the storage")
	}
	if len(st.DamagedPacks) > 0 {
		lost = append(lost, packList(st.DamagedPacks)+" holding data that does not read back")
	}
	if st.LostContents > 0 {
		lost = append(lost, fmt.Sprintf("%d contents lost and dropped from the index", st.LostContents))
	}
	msg := "The repository's storage lost data"
	if len(lost) > 0 {
		msg += " (" + strings.Join(lost, "; ") + ")"
	}

	vms := map[types.NamespacedName]bool{}
	var listed int64
	var named []string
	for _, d := range st.Damaged {
		vms[types.NamespacedName{Namespace: d.Namespace, Name: d.Name}] = true
		listed += d.Snapshots
		named = append(named, fmt.Sprintf("%s/%s:%s (%d)", d.Namespace, d.Name, d.Path, d.Snapshots))
	}
	snapshots := max(st.DamagedSnapshots, listed)
	if snapshots == 0 {
		msg += ": no snapshot references it."
	} else {
		ofVMs := fmt.Sprintf("%d VMs", len(vms))
		if listed < snapshots {
			ofVMs = "at least " + ofVMs
		}
		msg += fmt.Sprintf(": %d snapshots of %s reference it and cannot be restored whole", snapshots, ofVMs)
		if len(named) > 0 {
			msg += ": " + abbreviate(named)
		}
		msg += "."
		if listed < snapshots {
			msg += fmt.Sprintf(" status.integrity.damaged is truncated: it lists %d paths with %d of those snapshots.", len(st.Damaged), listed)
		}
		msg += " Everything else in those snapshots restores; each guest uploads the lost files again at its next snapshot if they are unchanged, which makes its snapshots whole (each VM gets a BackupDamaged Event)."
	}
	if st.PendingContents > 0 {
		msg += fmt.Sprintf(" %d lost contents stay in the index, marked deleted, until Kopia's maintenance lets go of them (a day or two): guests upload those again only then.", st.PendingContents)
	}
	if len(st.Settled) > 0 {
		msg += " The pass " + settledMessage(st.Settled) + "."
	}
	return msg
}

// settledMessage says, after "the pass", what it settled.
func settledMessage(settled []v1alpha1.DamagedVM) string {
	var snapshots, files int64
	vms := map[types.NamespacedName]bool{}
	for _, d := range settled {
		snapshots += d.Snapshots
		files += d.Files
		vms[types.NamespacedName{Namespace: d.Namespace, Name: d.Name}] = true
	}
	return fmt.Sprintf("settled %d damaged snapshots of %d VMs that could no longer heal: their %d lost files are replaced by stubs, .INVALID.<name>, and every other file restores (each VM gets a BackupSettled Event)",
		snapshots, len(vms), files)
}

// capitalize is s with its first letter upper case.
func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// packList names packs, a few of them, and says when there may be more
// than the pod listed.
func packList(packs []string) string {
	if len(packs) >= maintenancestate.MaxListedPacks {
		return fmt.Sprintf("%d or more packs, among them %s,", len(packs), strings.Join(packs[:3], ", "))
	}
	if len(packs) == 1 {
		return "pack " + packs[0]
	}
	return "packs " + abbreviate(packs)
}

// plural is one when n is 1, else many.
func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// timestamp renders t as the conditions do.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// metaTime is t for the API, nil when zero.
func metaTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	return &metav1.Time{Time: t}
}

// bounded is at most the first n of list, copied.
func bounded[T any](list []T, n int) []T {
	if len(list) == 0 {
		return nil
	}
	return append([]T(nil), list[:min(len(list), n)]...)
}

// truncated is whether st.Damaged lists fewer snapshots than are damaged:
// then a path that left the list may still be damaged.
func truncated(st *v1alpha1.IntegrityStatus) bool {
	var listed int64
	for _, d := range st.Damaged {
		listed += d.Snapshots
	}
	return listed < st.DamagedSnapshots
}

// vmNotice is an Event to record on a VM.
type vmNotice struct {
	VM    types.NamespacedName
	Event vmevent.Event
}

// damageKey is one backed-up path of one VM.
type damageKey struct{ namespace, name, path string }

// damageNotices are the Events for the VMs whose snapshots the new status
// after finds damaged since before (the status the previous pass wrote):
// BackupDamaged for a path newly listed or with more damaged snapshots
// than before, BackupSettled for a path a new pass settled, BackupHealed
// for a path no longer listed that was not settled. A path that left a
// truncated list, or a status no complete pass wrote, heals nothing: its
// snapshots may still be damaged. server is the BSLS.
func damageNotices(server types.NamespacedName, before, after *v1alpha1.IntegrityStatus) []vmNotice {
	if after == nil {
		return nil
	}
	settled := map[damageKey]bool{}
	for _, d := range after.Settled {
		settled[damageKey{d.Namespace, d.Name, d.Path}] = true
	}
	was := map[damageKey]v1alpha1.DamagedVM{}
	if before != nil {
		for _, d := range before.Damaged {
			was[damageKey{d.Namespace, d.Name, d.Path}] = d
		}
	}
	var notices []vmNotice
	is := map[damageKey]bool{}
	for _, d := range after.Damaged {
		k := damageKey{d.Namespace, d.Name, d.Path}
		is[k] = true
		if prev, ok := was[k]; ok && d.Snapshots <= prev.Snapshots {
			continue
		}
		notices = append(notices, vmNotice{
			VM:    types.NamespacedName{Namespace: d.Namespace, Name: d.Name},
			Event: vmevent.Warning(ReasonBackupDamaged, damagedMessage(server, d)),
		})
	}
	// A pass lists what it settled once: a status of another pass than
	// before's says it for the first time.
	newPass := after.LastVerified != nil && (before == nil || before.LastVerified == nil || !before.LastVerified.Equal(after.LastVerified))
	if newPass {
		for _, d := range after.Settled {
			notices = append(notices, vmNotice{
				VM:    types.NamespacedName{Namespace: d.Namespace, Name: d.Name},
				Event: vmevent.Warning(ReasonBackupSettled, settledVMMessage(server, d)),
			})
		}
	}
	if after.LastVerified == nil || truncated(after) || before == nil {
		return notices
	}
	for _, d := range before.Damaged {
		if k := (damageKey{d.Namespace, d.Name, d.Path}); is[k] || settled[k] {
			continue
		}
		notices = append(notices, vmNotice{
			VM: types.NamespacedName{Namespace: d.Namespace, Name: d.Name},
			Event: vmevent.Normal(ReasonBackupHealed, fmt.Sprintf(
				"No snapshot of %s on BackupStorageLocationServer %s references lost data any more (verified at %s): the guest uploaded the lost files again, or the damaged snapshots expired",
				d.Path, server, timestamp(after.LastVerified.Time))),
		})
	}
	return notices
}

// damagedMessage tells a VM's owner which snapshots of path d.Path lost
// data, what still restores, and how they heal.
func damagedMessage(server types.NamespacedName, d v1alpha1.DamagedVM) string {
	var when []string
	switch {
	case d.Oldest != nil && d.Newest != nil && !d.Oldest.Equal(d.Newest):
		when = append(when, fmt.Sprintf("started %s to %s", timestamp(d.Oldest.Time), timestamp(d.Newest.Time)))
	case d.Newest != nil:
		when = append(when, "started "+timestamp(d.Newest.Time))
	}
	switch {
	case len(d.IDs) == 0:
	case int64(len(d.IDs)) < d.Snapshots:
		when = append(when, "the most recent IDs "+strings.Join(d.IDs, ", "))
	default:
		when = append(when, plural(int64(len(d.IDs)), "ID ", "IDs ")+strings.Join(d.IDs, ", "))
	}
	them := plural(d.Snapshots, "it", "them")
	msg := fmt.Sprintf("%d %s of %s on BackupStorageLocationServer %s %s data the storage lost",
		d.Snapshots, plural(d.Snapshots, "snapshot", "snapshots"), d.Path, server, plural(d.Snapshots, "references", "reference"))
	if len(when) > 0 {
		msg += " (" + strings.Join(when, "; ") + ")"
	}
	msg += fmt.Sprintf(": %d %s in %s %s data. Everything else in %s restores (guestbackup-kopia snapshot restore --ignore-errors restores the rest and names what it skipped); those files do not restore from %s until their data is uploaded again. ",
		d.Files, plural(d.Files, "file", "files"), them, plural(d.Files, "misses", "miss"), them, them)
	if d.Healing {
		msg += fmt.Sprintf("The guest's next snapshot uploads those files again if they are unchanged, which makes %s whole", plural(d.Snapshots, "this snapshot", "these snapshots"))
	} else {
		msg += fmt.Sprintf("The latest snapshot of %s is whole, so %s cannot heal that way: the server rewrites %s with a stub for each lost file (BackupSettled)", d.Path, them, them)
	}
	return msg + "; see " + integrityDocs
}

// settledVMMessage tells a VM's owner that damaged snapshots of path
// d.Path were settled: what is lost for good, and what restores.
func settledVMMessage(server types.NamespacedName, d v1alpha1.DamagedVM) string {
	them := plural(d.Snapshots, "it", "them")
	msg := fmt.Sprintf("%d damaged %s of %s on BackupStorageLocationServer %s could no longer heal (the guest's latest snapshot is whole, or the damage is a week old) and %s rewritten",
		d.Snapshots, plural(d.Snapshots, "snapshot", "snapshots"), d.Path, server, plural(d.Snapshots, "was", "were"))
	var when []string
	switch {
	case d.Oldest != nil && d.Newest != nil && !d.Oldest.Equal(d.Newest):
		when = append(when, fmt.Sprintf("started %s to %s", timestamp(d.Oldest.Time), timestamp(d.Newest.Time)))
	case d.Newest != nil:
		when = append(when, "started "+timestamp(d.Newest.Time))
	}
	if len(d.IDs) > 0 {
		when = append(when, "formerly "+plural(int64(len(d.IDs)), "ID ", "IDs ")+strings.Join(d.IDs, ", "))
	}
	if len(when) > 0 {
		msg += " (" + strings.Join(when, "; ") + ")"
	}
	return msg + fmt.Sprintf(": each of the %d %s whose data the storage lost is replaced by a stub, .INVALID.<name>, naming what was lost, and is lost from %s for good; every other file in %s restores as before, under new snapshot IDs; see %s",
		d.Files, plural(d.Files, "file", "files"), them, them, integrityDocs)
}

// liveNotices returns the notices of decision d for BSLS orig (as read
// at the start of the pass), diffed again against the status the API
// server holds when they are not none. The pass reads its BSLS around the
// cache already (reconcile), so this second read only catches a status
// written since by another writer; it stays because a notice, unlike the
// BSLS's Events, is recorded before the status write and cannot be taken
// back. Read only then, so that a pass with nothing to announce costs no
// request.
func (r *Reconciler) liveNotices(ctx context.Context, orig *v1alpha1.BackupStorageLocationServer, d decision) ([]vmNotice, error) {
	if len(d.VMNotices) == 0 {
		return nil, nil
	}
	live := &v1alpha1.BackupStorageLocationServer{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(orig), live); err != nil {
		return nil, fmt.Errorf("read BackupStorageLocationServer %s/%s before announcing Events on its VMs: %w", orig.Namespace, orig.Name, err)
	}
	if equality.Semantic.DeepEqual(live.Status.Integrity, orig.Status.Integrity) && equality.Semantic.DeepEqual(live.Status.Quota, orig.Status.Quota) {
		return d.VMNotices, nil
	}
	server := client.ObjectKeyFromObject(orig)
	return append(damageNotices(server, live.Status.Integrity, d.Integrity), quotaNotices(server, live.Status.Quota, d.Quota)...), nil
}

// recordVMNotices records each notice on its VM, by the VM's metadata from
// the cache so that the Event carries its UID (kubectl describe shows only
// those). A source whose identity names no VM, or a VM that is gone,
// carries no Event.
func (r *Reconciler) recordVMNotices(ctx context.Context, notices []vmNotice) {
	for _, n := range notices {
		if len(validation.IsDNS1123Label(n.VM.Namespace)) > 0 || len(validation.IsDNS1123Subdomain(n.VM.Name)) > 0 {
			continue // not a VM's identity
		}
		vm := &metav1.PartialObjectMetadata{}
		vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
		if err := r.Client.Get(ctx, n.VM, vm); err != nil {
			log.FromContext(ctx).V(1).Info("no Event on a VM whose snapshots are damaged or healed", "vm", n.VM, "reason", n.Event.Reason, "error", err.Error())
			continue
		}
		vmevent.Record(r.Recorder, vm.ObjectMeta, []vmevent.Event{n.Event})
	}
}
