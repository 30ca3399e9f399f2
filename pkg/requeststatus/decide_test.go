package requeststatus

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
)

const uid = "6a0c0000-0000-4000-8000-000000000001"

var (
	now     = time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	started = now.Add(-time.Minute)
)

func request(phase v1alpha1.RequestPhase, paths ...string) *v1alpha1.GuestSnapshot {
	return &v1alpha1.GuestSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "before-upgrade", UID: types.UID(uid)},
		Spec:       v1alpha1.GuestSnapshotSpec{VM: "web", Paths: paths, Requester: &v1alpha1.Requester{Username: "alice"}},
		Status:     v1alpha1.GuestSnapshotStatus{Phase: phase},
	}
}

func vm(annotations map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web", Annotations: annotations}}
}

var optedIn = map[string]string{v1alpha1.AnnotationServer: "backup/main", v1alpha1.AnnotationPaths: "/srv,/etc"}

// server carries requests: its guests poll every 30 s.
var server = &v1alpha1.BackupStorageLocationServer{
	ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main"},
	Status:     v1alpha1.BackupStorageLocationServerStatus{RequestPollInterval: &metav1.Duration{Duration: 30 * time.Second}},
}

func guest(results ...activity.Result) *activity.Guest {
	return &activity.Guest{User: "web@team-a", Results: results}
}

func TestDecide(t *testing.T) {
	ended := now.Add(-10 * time.Second)
	for name, tt := range map[string]struct {
		in                 Inputs
		phase              v1alpha1.RequestPhase
		message, events    string
		snapshots, bytesOK bool
	}{
		"new, its VM opted in: handed to the server": {
			in:    Inputs{Snapshot: request(""), VM: vm(optedIn), Server: server, Admitted: true},
			phase: v1alpha1.PhasePending, message: "waiting for the guest of VirtualMachine web",
			events: "Normal SnapshotRequested Snapshot requested by alice (before-upgrade)",
		},
		"pending, no answer yet: nothing new": {
			in:    Inputs{Snapshot: request(v1alpha1.PhasePending), VM: vm(optedIn), Server: server, Admitted: true, Guest: guest()},
			phase: v1alpha1.PhasePending,
		},
		"its VM does not exist": {
			in:    Inputs{Snapshot: request("")},
			phase: v1alpha1.PhaseFailed, message: "VirtualMachine web does not exist in namespace team-a",
			events: "Warning SnapshotRequestFailed Snapshot requested by alice (before-upgrade) failed: VirtualMachine web does not exist",
		},
		"its VM opted out": {
			in:    Inputs{Snapshot: request(v1alpha1.PhasePending), VM: vm(nil)},
			phase: v1alpha1.PhaseFailed, message: "is not backed up by guestbackup: annotate it with guestbackup.io/server",
			events: "Warning SnapshotRequestFailed",
		},
		"no path anywhere": {
			in:    Inputs{Snapshot: request(""), VM: vm(map[string]string{v1alpha1.AnnotationServer: "backup/main"}), Server: server, Admitted: true},
			phase: v1alpha1.PhaseFailed, message: "the request names no path and the VM has no annotation guestbackup.io/paths: set spec.paths",
			events: "Warning SnapshotRequestFailed",
		},
		"its VM's server does not exist": {
			in:    Inputs{Snapshot: request(""), VM: vm(optedIn)},
			phase: v1alpha1.PhaseFailed, message: "BackupStorageLocationServer backup/main, which VirtualMachine web's annotation guestbackup.io/server names, does not exist",
			events: "Warning SnapshotRequestFailed",
		},
		"its namespace is not admitted by the server": {
			in:    Inputs{Snapshot: request(""), VM: vm(optedIn), Server: server},
			phase: v1alpha1.PhaseFailed, message: "BackupStorageLocationServer backup/main does not admit namespace team-a",
			events: "Warning SnapshotRequestFailed",
		},
		"its server publishes no client port": {
			in:    Inputs{Snapshot: request(""), VM: vm(optedIn), Server: &v1alpha1.BackupStorageLocationServer{}, Admitted: true},
			phase: v1alpha1.PhaseFailed, message: "carries no requests",
			events: "Warning SnapshotRequestFailed",
		},
		"a tag that poses as the request's own": {
			in: Inputs{Snapshot: func() *v1alpha1.GuestSnapshot {
				s := request("")
				s.Spec.Tags = map[string]string{"guestbackup-request": "another-uid"}
				return s
			}(), VM: vm(optedIn), Server: server, Admitted: true},
			phase: v1alpha1.PhaseFailed, message: `it cannot be handed to the guest: request ` + uid + `: tag "guestbackup-request" is not a tag a request may set`,
			events: "Warning SnapshotRequestFailed",
		},
		"too big to hand over": {
			in: Inputs{Snapshot: request("", func() []string {
				var paths []string
				for i := range 8 {
					paths = append(paths, "/"+strings.Repeat(string(rune('a'+i)), 4000))
				}
				return paths
			}()...), VM: vm(optedIn), Server: server, Admitted: true},
			phase: v1alpha1.PhaseFailed, message: "more than 16384: name fewer or shorter paths, tags and description",
			events: "Warning SnapshotRequestFailed",
		},
		"its own paths, though the VM has none": {
			in:    Inputs{Snapshot: request("", "/srv"), VM: vm(map[string]string{v1alpha1.AnnotationServer: "backup/main"}), Server: server, Admitted: true},
			phase: v1alpha1.PhasePending, events: "Normal SnapshotRequested",
		},
		"started by the guest": {
			in:    Inputs{Snapshot: request(v1alpha1.PhasePending), VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Running", Started: started})},
			phase: v1alpha1.PhaseRunning, message: "the guest is taking the snapshots",
			events: "Normal SnapshotStarted Snapshot requested by alice (before-upgrade) started in the guest",
		},
		"another request's result changes nothing": {
			in:    Inputs{Snapshot: request(v1alpha1.PhasePending), VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: "other", Phase: "Succeeded", Started: started, Ended: &ended})},
			phase: v1alpha1.PhasePending,
		},
		"taken": {
			in: Inputs{Snapshot: request(v1alpha1.PhaseRunning), VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Succeeded", Started: started, Ended: &ended, Snapshots: []activity.Snapshot{
				{ID: "k1", Path: "/srv", Files: 3, Bytes: 2048}, {ID: "k2", Path: "/etc", Files: 1, Bytes: 1024},
			}})},
			phase: v1alpha1.PhaseSucceeded, message: "took 2 snapshot(s): 4 files, 3.0 KiB", snapshots: true,
			events: "Normal SnapshotTaken Snapshot requested by alice (before-upgrade) taken: /srv (k1), /etc (k2)",
		},
		"failed in the guest": {
			in:    Inputs{Snapshot: request(v1alpha1.PhaseRunning), VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Failed", Message: "remote requests are turned off in this guest", Started: started, Ended: &ended})},
			phase: v1alpha1.PhaseFailed, message: "remote requests are turned off in this guest",
			events: "Warning SnapshotRequestFailed Snapshot requested by alice (before-upgrade) failed: remote requests are turned off in this guest",
		},
		"ended: stays as it is, VM gone or not": {
			in:    Inputs{Snapshot: request(v1alpha1.PhaseSucceeded)},
			phase: v1alpha1.PhaseSucceeded,
		},
	} {
		t.Run(name, func(t *testing.T) {
			tt.in.Now = now
			d := Decide(tt.in)
			if d.Status.Phase != tt.phase {
				t.Errorf("phase %q, want %q", d.Status.Phase, tt.phase)
			}
			if !strings.Contains(d.Status.Message, tt.message) {
				t.Errorf("message %q, want it to contain %q", d.Status.Message, tt.message)
			}
			var events []string
			for _, e := range d.Events {
				events = append(events, e.Type+" "+e.Reason+" "+e.Message)
			}
			if got := strings.Join(events, "\n"); tt.events == "" && got != "" || !strings.HasPrefix(got, tt.events) {
				t.Errorf("events %q, want %q", got, tt.events)
			}
			if tt.snapshots && (len(d.Status.Snapshots) != 2 || d.Status.Files != 4 || d.Status.Bytes != 3072 || d.Status.StartTime == nil || d.Status.CompletionTime == nil) {
				t.Errorf("status %+v", d.Status)
			}
			if tt.phase == v1alpha1.PhaseFailed && tt.in.Snapshot.Status.Phase != v1alpha1.PhaseFailed && d.Status.CompletionTime == nil {
				t.Error("a failure without a completion time")
			}
		})
	}
}
