// Package requeststatus is the controller's side of the requests a guest
// carries out (GuestSnapshot, GuestRestore; docs/requests.md). It admits
// each request to its VM's server (phase Pending), where the BSLS
// reconciler lists it in the users Secret its guest's server pod reads;
// the guest polls for it, carries it out and answers; the server pod
// checks the answer against the repository (a snapshot's) or chooses what
// it restores from (a restore's) and publishes it in the guest's activity
// (package activity); and this package records that into the request's
// status, with Events on the request and on the VM that name who asked.
// A restore into a claim is carried out the same way by a Job instead of
// the guest (job.go, package restorejob), which this package creates, with
// the claim when the request asks for a new one.
package requeststatus

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/units"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// Event reasons, on the request and on its VM.
const (
	// ReasonSnapshotRequested: the request was handed to the VM's server;
	// its guest takes it at its next poll.
	ReasonSnapshotRequested = "SnapshotRequested"
	// ReasonSnapshotStarted: the guest started it.
	ReasonSnapshotStarted = "SnapshotStarted"
	// ReasonSnapshotTaken: every path has its snapshot in the repository.
	ReasonSnapshotTaken = "SnapshotTaken"
	// ReasonSnapshotFailed: the request ended without a snapshot of each
	// path; the message says why.
	ReasonSnapshotFailed = "SnapshotRequestFailed"

	// ReasonRestoreRequested: a GuestRestore was handed to the VM's
	// server; its guest takes it at its next poll.
	ReasonRestoreRequested = "RestoreRequested"
	// ReasonRestoreStarted: the guest started it, from the snapshots its
	// server chose.
	ReasonRestoreStarted = "RestoreStarted"
	// ReasonRestored: the guest restored every path.
	ReasonRestored = "Restored"
	// ReasonRestoreFailed: the restore ended without restoring every path;
	// the message says why.
	ReasonRestoreFailed = "RestoreRequestFailed"
	// ReasonRestoreListed: a dry run listed what the restore would write
	// (status.dryRun), and wrote nothing.
	ReasonRestoreListed = "RestoreListed"
)

// Request is what a decision reads of a request, of either kind.
type Request struct {
	// Kind is RequestSnapshot or RequestRestore.
	Kind string
	// Name and Namespace name the request; UID is what its guest's
	// result names it by.
	Name, Namespace, UID string
	// VM is the VM whose guest carries it out.
	VM string
	// Requester is who asked, as the webhook stamped it.
	Requester *v1alpha1.Requester
	// Where says where a restore writes, for its messages.
	Where string
	// Carrier is who carries it out, for its messages: the guest, or a
	// restore's Job (userset.IntoClaim).
	Carrier string
	// DryRun is a restore that only lists what it would write.
	DryRun bool
	// History is a dry run that lists its path's versions instead; Path
	// is that path.
	History bool
	Path    string
	// Carry says why the request cannot be handed to the guest of a VM
	// with these annotations; nil when it can.
	Carry func(vmAnnotations map[string]string) error
}

// Request kinds.
const (
	RequestSnapshot = "Snapshot"
	RequestRestore  = "Restore"
)

// Status is what a decision sets of a request's status, the same for both
// kinds: a GuestSnapshot's files and bytes are what its snapshots hold, a
// GuestRestore's (status.progress) what it restored.
type Status struct {
	Phase          v1alpha1.RequestPhase
	Message        string
	Snapshots      []v1alpha1.PathSnapshot
	Files, Bytes   int64
	StartTime      *metav1.Time
	CompletionTime *metav1.Time
	// DryRun is a restore's dry run's listing.
	DryRun *v1alpha1.DryRunListing
	// History is a history's versions of its path.
	History []v1alpha1.PathVersion
}

// Inputs are what a decision about one request reads.
type Inputs struct {
	Request Request
	// Status is the request's status now.
	Status Status
	// VM is the request's VM (metadata); nil when it does not exist.
	VM *metav1.PartialObjectMetadata
	// Server is the BSLS the VM's annotation names; nil when it does not
	// exist. Admitted is whether it admits the request's namespace.
	Server   *v1alpha1.BackupStorageLocationServer
	Admitted bool
	// Namespace is the request's, read with Server.
	Namespace *corev1.Namespace
	// Guest is the activity the VM's server published for its guest; nil
	// when it published none.
	Guest *activity.Guest
	// Job is a restore's Job and claim, for a restore into a claim
	// (userset.IntoClaim); nil for any other request.
	Job *JobState
	// Now stamps the end of a request the controller fails itself.
	Now time.Time
}

// Decision is the status a request should have, and the Events that
// announce the change.
type Decision struct {
	Status Status
	// Events go on the request and on its VM.
	Events []Event
	// CreateClaim and CreateJob create a restore's claim and Job
	// (RestoreClaim, RestoreJob), before the status is written.
	CreateClaim, CreateJob bool
}

// Event is one Event to record.
type Event struct {
	Type, Reason, Message string
}

// words are a kind's Event reasons and phrases.
type words struct {
	requested, started, done, failed string
	// running is the status message while the carrier works.
	running string
}

var kindWords = map[string]words{
	RequestSnapshot: {ReasonSnapshotRequested, ReasonSnapshotStarted, ReasonSnapshotTaken, ReasonSnapshotFailed, "is taking the snapshots"},
	RequestRestore:  {ReasonRestoreRequested, ReasonRestoreStarted, ReasonRestored, ReasonRestoreFailed, "is restoring"},
}

// theGuest carries out every request but a restore into a claim.
const theGuest = "the guest"

// Decide is what becomes of a request. One that ended stays as it is; one
// whose VM cannot carry it out fails at once, saying what to fix;
// otherwise its status follows the guest's result.
func Decide(in Inputs) Decision {
	r, w := in.Request, kindWords[in.Request.Kind]
	d := Decision{Status: in.Status}
	d.Status.Snapshots = slices.Clone(in.Status.Snapshots)
	if ended(in.Status.Phase) {
		return d
	}
	asked := fmt.Sprintf("%s requested by %s (%s)", r.Kind, requester(r), r.Name)
	fail := func(problem string) Decision {
		now := metav1.NewTime(in.Now)
		d.Status.Phase, d.Status.Message, d.Status.CompletionTime = v1alpha1.PhaseFailed, problem, &now
		if r.Kind == RequestRestore {
			d.Status.Files, d.Status.Bytes = 0, 0
		}
		d.Events = append(d.Events, Event{"Warning", w.failed, fmt.Sprintf("%s failed: %s", asked, problem)})
		d.CreateClaim, d.CreateJob = false, false
		return d
	}
	if problem := unfit(in); problem != "" {
		return fail(problem)
	}
	if j := in.Job; j != nil {
		if j.ClaimProblem != "" {
			return fail(j.ClaimProblem)
		}
		d.CreateJob, d.CreateClaim = !j.Exists, !j.Exists && j.CreateClaim
	}
	var res *activity.Result
	if in.Guest != nil {
		if i := slices.IndexFunc(in.Guest.Results, func(res activity.Result) bool { return res.UID == r.UID }); i >= 0 {
			res = &in.Guest.Results[i]
		}
	}
	if j := in.Job; j != nil && j.Failed != "" && (res == nil || res.Phase == string(v1alpha1.PhaseRunning)) {
		return fail(fmt.Sprintf("Job %s failed before it told how the restore ended (%s): what it wrote into PersistentVolumeClaim %s is unknown; kubectl logs -n %s job/%s says why",
			j.Name, j.Failed, j.Claim, r.Namespace, j.Name))
	}
	if res == nil {
		if in.Status.Phase == "" {
			d.Status.Phase = v1alpha1.PhasePending
			d.Status.Message = fmt.Sprintf("waiting for the guest of VirtualMachine %s to take it: a running guest polls its server for requests", r.VM)
			d.Events = append(d.Events, Event{"Normal", w.requested, asked})
		}
		if j := in.Job; j != nil {
			// What keeps the Job's pod from running is the owner's to
			// see (a claim that does not bind, a Secret missing) long
			// before the Job's deadline fails it.
			d.Status.Message = fmt.Sprintf("waiting for Job %s to restore under VirtualMachine %s's identity", j.Name, r.VM)
			if j.Waiting != "" {
				d.Status.Message += ": its pod does not run yet: " + j.Waiting
			}
		}
		return d
	}
	start := metav1.NewTime(res.Started)
	d.Status.StartTime = &start
	d.Status.Snapshots, d.Status.Files, d.Status.Bytes = nil, 0, 0
	var from []string
	for _, sn := range res.Snapshots {
		d.Status.Snapshots = append(d.Status.Snapshots, v1alpha1.PathSnapshot{Path: sn.Path, ID: sn.ID})
		d.Status.Files += int64(sn.Files)
		d.Status.Bytes += sn.Bytes
		from = append(from, fmt.Sprintf("%s (%s)", sn.Path, sn.ID))
	}
	size := fmt.Sprintf("%d files, %s", d.Status.Files, units.Bytes(uint64(max(d.Status.Bytes, 0))))
	switch res.Phase {
	case string(v1alpha1.PhaseRunning):
		if in.Status.Phase != v1alpha1.PhaseRunning {
			d.Status.Phase = v1alpha1.PhaseRunning
			message := asked + " started " + startedBy(r)
			if r.Kind == RequestRestore {
				message += ": " + strings.Join(from, ", ") + " " + r.Where
			}
			d.Events = append(d.Events, Event{"Normal", w.started, message})
		}
		d.Status.Message = carrier(r) + " " + w.running
		if r.Kind == RequestRestore {
			// What it wrote so far is what the paths it restored hold.
			d.Status.Files, d.Status.Bytes = restoredSoFar(res)
			if res.Restored > 0 {
				// The figures are status.progress's, which the plugin
				// prints beside this message.
				d.Status.Message += fmt.Sprintf(": %d of %d paths restored so far", min(res.Restored, len(res.Snapshots)), len(res.Snapshots))
			}
		}
	case string(v1alpha1.PhaseSucceeded), string(v1alpha1.PhaseFailed):
		d.Status.Phase = v1alpha1.RequestPhase(res.Phase)
		if res.Ended != nil {
			end := metav1.NewTime(*res.Ended)
			d.Status.CompletionTime = &end
		}
		switch {
		case d.Status.Phase == v1alpha1.PhaseSucceeded && r.History:
			d.Status.Files, d.Status.Bytes = 0, 0
			d.Status.History = history(res.History)
			d.Status.Message = fmt.Sprintf("listed %d versions of %s, newest first; nothing was written", len(d.Status.History), r.Path)
			d.Events = append(d.Events, Event{"Normal", ReasonRestoreListed, fmt.Sprintf("%s listed the versions of %s: %d, newest first", asked, r.Path, len(d.Status.History))})
		case d.Status.Phase == v1alpha1.PhaseSucceeded && r.DryRun:
			// A dry run writes nothing: what it counts is what a restore
			// would write.
			d.Status.Files, d.Status.Bytes = 0, 0
			d.Status.DryRun = dryRun(res.Listing)
			d.Status.Message = fmt.Sprintf("a dry run: restoring would write %d files, %s %s; nothing was written", d.Status.DryRun.Files, units.Bytes(uint64(max(d.Status.DryRun.Bytes, 0))), r.Where)
			d.Events = append(d.Events, Event{"Normal", ReasonRestoreListed, fmt.Sprintf("%s listed (a dry run): %s would be restored %s", asked, strings.Join(from, ", "), r.Where)})
		case d.Status.Phase == v1alpha1.PhaseSucceeded && r.Kind == RequestRestore:
			d.Status.Message = fmt.Sprintf("restored %s %s", size, r.Where)
			d.Events = append(d.Events, Event{"Normal", w.done, fmt.Sprintf("%s restored %s %s", asked, strings.Join(from, ", "), r.Where)})
		case d.Status.Phase == v1alpha1.PhaseSucceeded:
			d.Status.Message = fmt.Sprintf("took %d snapshot(s): %s", len(res.Snapshots), size)
			d.Events = append(d.Events, Event{"Normal", w.done, fmt.Sprintf("%s taken: %s", asked, strings.Join(from, ", "))})
		default:
			if r.Kind == RequestRestore {
				// What a failed restore wrote is unknown.
				d.Status.Files, d.Status.Bytes = 0, 0
			}
			d.Status.Message = res.Message
			if d.Status.Message == "" {
				d.Status.Message = "the guest reported a failure without saying why: see its journal (journalctl -u guestbackup-requests)"
				if in.Job != nil {
					d.Status.Message = fmt.Sprintf("Job %s reported a failure without saying why: kubectl logs -n %s job/%s", in.Job.Name, r.Namespace, in.Job.Name)
				}
			}
			d.Events = append(d.Events, Event{"Warning", w.failed, fmt.Sprintf("%s failed: %s", asked, d.Status.Message)})
		}
	}
	return d
}

// restoredSoFar is what a running restore's carrier wrote of its plan:
// what the snapshots of the paths it says it restored hold there.
func restoredSoFar(res *activity.Result) (files, bytes int64) {
	for _, sn := range res.Snapshots[:min(max(res.Restored, 0), len(res.Snapshots))] {
		files += int64(sn.Files)
		bytes += sn.Bytes
	}
	return files, bytes
}

// unfit says why the request's VM cannot carry it out, or "".
func unfit(in Inputs) string {
	r, vm, server := in.Request, in.VM, in.Server
	if vm == nil {
		return fmt.Sprintf("VirtualMachine %s does not exist in namespace %s", r.VM, r.Namespace)
	}
	ref := vm.Annotations[v1alpha1.AnnotationServer]
	if ref == "" {
		return fmt.Sprintf("VirtualMachine %s is not backed up by guestbackup: annotate it with %s to opt it in", r.VM, v1alpha1.AnnotationServer)
	}
	switch {
	case server == nil:
		return fmt.Sprintf("BackupStorageLocationServer %s, which VirtualMachine %s's annotation %s names, does not exist", ref, r.VM, v1alpha1.AnnotationServer)
	case !in.Admitted:
		return fmt.Sprintf("BackupStorageLocationServer %s does not admit namespace %s (its spec.access.namespaceSelector): ask its admin", ref, r.Namespace)
	case server.Status.RequestPollInterval == nil:
		return fmt.Sprintf("BackupStorageLocationServer %s carries no requests: its guests poll its client port, which it does not publish yet (status.client)", ref)
	}
	if err := r.Carry(vm.Annotations); err != nil {
		return err.Error()
	}
	return ""
}

// carrier is who carries r out.
func carrier(r Request) string {
	if r.Carrier == "" {
		return theGuest
	}
	return r.Carrier
}

// startedBy says, in a started Event, who started r.
func startedBy(r Request) string {
	if r.Carrier == "" {
		return "in the guest"
	}
	return "by " + r.Carrier
}

// requester names who asked, as the webhook stamped it.
func requester(r Request) string {
	if r.Requester != nil && r.Requester.Username != "" {
		return r.Requester.Username
	}
	return "an unknown user"
}

// ended reports whether phase is final.
func ended(phase v1alpha1.RequestPhase) bool {
	return phase == v1alpha1.PhaseSucceeded || phase == v1alpha1.PhaseFailed
}

// SnapshotRequest is what a decision reads of GuestSnapshot s, and
// SnapshotStatus its status.
func SnapshotRequest(s *v1alpha1.GuestSnapshot) Request {
	return Request{Kind: RequestSnapshot, Name: s.Name, Namespace: s.Namespace, UID: string(s.UID), VM: s.Spec.VM, Requester: s.Spec.Requester,
		Carry: func(a map[string]string) error { _, err := cloudinit.SnapshotRequest(s, a); return err }}
}

// SnapshotStatus is what a decision reads of a GuestSnapshot's status.
func SnapshotStatus(st v1alpha1.GuestSnapshotStatus) Status {
	return Status{Phase: st.Phase, Message: st.Message, Snapshots: st.Snapshots, Files: st.Files, Bytes: st.Bytes, StartTime: st.StartTime, CompletionTime: st.CompletionTime}
}

// applySnapshot writes what a decision set into a GuestSnapshot's status.
func applySnapshot(st Status, to *v1alpha1.GuestSnapshotStatus) {
	to.Phase, to.Message, to.Snapshots, to.Files, to.Bytes, to.StartTime, to.CompletionTime = st.Phase, st.Message, st.Snapshots, st.Files, st.Bytes, st.StartTime, st.CompletionTime
}

// RestoreRequest is what a decision reads of GuestRestore g.
func RestoreRequest(g *v1alpha1.GuestRestore) Request {
	where := "into " + path.Join(v1alpha1.RestoresFolder, g.Name) + " in the guest"
	switch t := g.Spec.Target; {
	case t.InPlace:
		where = "in place in the guest"
	case t.Directory != "":
		where = "into " + path.Clean(t.Directory) + " in the guest"
	}
	var by string
	if claim, _ := ClaimOf(g); claim != "" {
		where = "into folder " + userset.ClaimFolder(g.Name) + " of PersistentVolumeClaim " + claim
		if userset.IntoClaim(g) {
			by = "Job " + RestoreJobName(g)
		}
	}
	if g.Spec.SourceVM != "" && g.Spec.SourceVM != g.Spec.VM {
		where = "from VirtualMachine " + g.Spec.SourceVM + "'s snapshots " + where
	}
	r := Request{Kind: RequestRestore, Name: g.Name, Namespace: g.Namespace, UID: string(g.UID), VM: g.Spec.VM, Requester: g.Spec.Requester, Where: where, Carrier: by, DryRun: g.Spec.DryRun,
		History: g.Spec.History,
		Carry:   func(a map[string]string) error { _, err := userset.RestoreRequest(g, a); return err }}
	if len(g.Spec.Paths) > 0 {
		r.Path = path.Clean(g.Spec.Paths[0])
	}
	return r
}

// RestoreStatus is what a decision reads of a GuestRestore's status.
func RestoreStatus(st v1alpha1.GuestRestoreStatus) Status {
	return Status{Phase: st.Phase, Message: st.Message, Snapshots: st.Snapshots, Files: st.Progress.Files, Bytes: st.Progress.Bytes, StartTime: st.StartTime, CompletionTime: st.CompletionTime, DryRun: st.DryRun,
		History: st.History}
}

// applyRestore writes what a decision set into a GuestRestore's status.
func applyRestore(st Status, to *v1alpha1.GuestRestoreStatus) {
	to.Phase, to.Message, to.Snapshots, to.Progress.Files, to.Progress.Bytes, to.StartTime, to.CompletionTime = st.Phase, st.Message, st.Snapshots, st.Files, st.Bytes, st.StartTime, st.CompletionTime
	to.DryRun, to.History = st.DryRun, st.History
}

// history is a server's versions of a path as a GuestRestore's
// status.history.
func history(versions []activity.Version) []v1alpha1.PathVersion {
	out := make([]v1alpha1.PathVersion, 0, len(versions))
	for _, v := range versions[:min(len(versions), v1alpha1.MaxHistoryVersions)] {
		pv := v1alpha1.PathVersion{SnapshotID: v.ID, StartTime: metav1.NewTime(v.Start), Type: v.Type, Size: v.Size, Changed: v.Changed}
		if !v.ModTime.IsZero() {
			t := metav1.NewTime(v.ModTime)
			pv.ModTime = &t
		}
		out = append(out, pv)
	}
	return out
}

// dryRun is a server's listing as a GuestRestore's status.dryRun.
func dryRun(l *activity.Listing) *v1alpha1.DryRunListing {
	out := &v1alpha1.DryRunListing{}
	if l == nil {
		return out
	}
	out.Files, out.Bytes, out.Truncated = l.Files, l.Bytes, l.Truncated
	for _, e := range l.Entries[:min(len(l.Entries), v1alpha1.MaxDryRunEntries)] {
		entry := v1alpha1.DryRunEntry{Path: e.Path, Type: e.Type, Size: e.Size}
		if !e.ModTime.IsZero() {
			t := metav1.NewTime(e.ModTime)
			entry.ModTime = &t
		}
		out.Entries = append(out.Entries, entry)
	}
	return out
}
