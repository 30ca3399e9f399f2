// Package requeststatus is the controller's side of the requests a guest
// carries out (GuestSnapshot, docs/requests.md). It admits each request to
// its VM's server (phase Pending), where the BSLS reconciler lists it in
// the users Secret its guest's server pod reads; the guest polls for it,
// takes the snapshots and answers; the server pod checks the answer
// against the repository and publishes it in the guest's activity
// (package activity); and this package records that into the request's
// status, with Events on the request and on the VM that name who asked.
package requeststatus

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/units"
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
)

// Inputs are what a decision about one GuestSnapshot reads.
type Inputs struct {
	Snapshot *v1alpha1.GuestSnapshot
	// VM is the request's VM (metadata); nil when it does not exist.
	VM *metav1.PartialObjectMetadata
	// Server is the BSLS the VM's annotation names; nil when it does not
	// exist. Admitted is whether it admits the request's namespace.
	Server   *v1alpha1.BackupStorageLocationServer
	Admitted bool
	// Guest is the activity the VM's server published for its guest; nil
	// when it published none.
	Guest *activity.Guest
	// Now stamps the end of a request the controller fails itself.
	Now time.Time
}

// Decision is the status a GuestSnapshot should have, and the Events that
// announce the change.
type Decision struct {
	Status v1alpha1.GuestSnapshotStatus
	// Events go on the request and on its VM.
	Events []Event
}

// Event is one Event to record.
type Event struct {
	Type, Reason, Message string
}

// Decide is what becomes of a GuestSnapshot. A request that ended stays
// as it is; one whose VM cannot carry it out fails at once, saying what
// to fix; otherwise its status follows the guest's result.
func Decide(in Inputs) Decision {
	s := in.Snapshot
	d := Decision{Status: *s.Status.DeepCopy()}
	if ended(s.Status.Phase) {
		return d
	}
	if problem := unfit(in); problem != "" {
		now := metav1.NewTime(in.Now)
		d.Status.Phase, d.Status.Message, d.Status.CompletionTime = v1alpha1.PhaseFailed, problem, &now
		d.Events = append(d.Events, Event{"Warning", ReasonSnapshotFailed, fmt.Sprintf("Snapshot requested by %s (%s) failed: %s", requester(s), s.Name, problem)})
		return d
	}
	var res *activity.Result
	if in.Guest != nil {
		if i := slices.IndexFunc(in.Guest.Results, func(r activity.Result) bool { return r.UID == string(s.UID) }); i >= 0 {
			res = &in.Guest.Results[i]
		}
	}
	if res == nil {
		if s.Status.Phase == "" {
			d.Status.Phase = v1alpha1.PhasePending
			d.Status.Message = fmt.Sprintf("waiting for the guest of VirtualMachine %s to take it: a running guest polls its server for requests", s.Spec.VM)
			d.Events = append(d.Events, Event{"Normal", ReasonSnapshotRequested, fmt.Sprintf("Snapshot requested by %s (%s)", requester(s), s.Name)})
		}
		return d
	}
	start := metav1.NewTime(res.Started)
	d.Status.StartTime = &start
	switch res.Phase {
	case string(v1alpha1.PhaseRunning):
		if s.Status.Phase != v1alpha1.PhaseRunning {
			d.Status.Phase = v1alpha1.PhaseRunning
			d.Status.Message = "the guest is taking the snapshots"
			d.Events = append(d.Events, Event{"Normal", ReasonSnapshotStarted, fmt.Sprintf("Snapshot requested by %s (%s) started in the guest", requester(s), s.Name)})
		}
	case string(v1alpha1.PhaseSucceeded), string(v1alpha1.PhaseFailed):
		d.Status.Phase = v1alpha1.RequestPhase(res.Phase)
		if res.Ended != nil {
			end := metav1.NewTime(*res.Ended)
			d.Status.CompletionTime = &end
		}
		d.Status.Snapshots, d.Status.Files, d.Status.Bytes = nil, 0, 0
		var taken []string
		for _, sn := range res.Snapshots {
			d.Status.Snapshots = append(d.Status.Snapshots, v1alpha1.PathSnapshot{Path: sn.Path, ID: sn.ID})
			d.Status.Files += int64(sn.Files)
			d.Status.Bytes += sn.Bytes
			taken = append(taken, fmt.Sprintf("%s (%s)", sn.Path, sn.ID))
		}
		if d.Status.Phase == v1alpha1.PhaseSucceeded {
			d.Status.Message = fmt.Sprintf("took %d snapshot(s): %d files, %s", len(res.Snapshots), d.Status.Files, units.Bytes(uint64(max(d.Status.Bytes, 0))))
			d.Events = append(d.Events, Event{"Normal", ReasonSnapshotTaken, fmt.Sprintf("Snapshot requested by %s (%s) taken: %s", requester(s), s.Name, strings.Join(taken, ", "))})
		} else {
			d.Status.Message = res.Message
			if d.Status.Message == "" {
				d.Status.Message = "the guest reported a failure without saying why: see its journal (journalctl -u guestbackup-requests)"
			}
			d.Events = append(d.Events, Event{"Warning", ReasonSnapshotFailed, fmt.Sprintf("Snapshot requested by %s (%s) failed: %s", requester(s), s.Name, d.Status.Message)})
		}
	}
	return d
}

// unfit says why the request's VM cannot carry it out, or "".
func unfit(in Inputs) string {
	s, vm, server := in.Snapshot, in.VM, in.Server
	if vm == nil {
		return fmt.Sprintf("VirtualMachine %s does not exist in namespace %s", s.Spec.VM, s.Namespace)
	}
	ref := vm.Annotations[v1alpha1.AnnotationServer]
	if ref == "" {
		return fmt.Sprintf("VirtualMachine %s is not backed up by guestbackup: annotate it with %s to opt it in", s.Spec.VM, v1alpha1.AnnotationServer)
	}
	switch {
	case server == nil:
		return fmt.Sprintf("BackupStorageLocationServer %s, which VirtualMachine %s's annotation %s names, does not exist", ref, s.Spec.VM, v1alpha1.AnnotationServer)
	case !in.Admitted:
		return fmt.Sprintf("BackupStorageLocationServer %s does not admit namespace %s (its spec.access.namespaceSelector): ask its admin", ref, s.Namespace)
	case server.Status.RequestPollInterval == nil:
		return fmt.Sprintf("BackupStorageLocationServer %s carries no requests: its guests poll its client port, which it does not publish yet (status.client)", ref)
	}
	if _, err := cloudinit.SnapshotRequest(s, vm.Annotations); err != nil {
		return err.Error()
	}
	return ""
}

// requester names who asked, as the webhook stamped it.
func requester(s *v1alpha1.GuestSnapshot) string {
	if s.Spec.Requester != nil && s.Spec.Requester.Username != "" {
		return s.Spec.Requester.Username
	}
	return "an unknown user"
}

// ended reports whether phase is final.
func ended(phase v1alpha1.RequestPhase) bool {
	return phase == v1alpha1.PhaseSucceeded || phase == v1alpha1.PhaseFailed
}
