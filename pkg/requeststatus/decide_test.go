package requeststatus

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

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
		snap               *v1alpha1.GuestSnapshot
		in                 Inputs
		phase              v1alpha1.RequestPhase
		message, events    string
		snapshots, bytesOK bool
	}{
		"new, its VM opted in: handed to the server": {
			snap: request(""), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true},
			phase: v1alpha1.PhasePending, message: "waiting for the guest of VirtualMachine web",
			events: "Normal SnapshotRequested Snapshot requested by alice (before-upgrade)",
		},
		"pending, no answer yet: nothing new": {
			snap: request(v1alpha1.PhasePending), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest()},
			phase: v1alpha1.PhasePending,
		},
		"its VM does not exist": {
			snap: request(""), in: Inputs{},
			phase: v1alpha1.PhaseFailed, message: "VirtualMachine web does not exist in namespace team-a",
			events: "Warning SnapshotRequestFailed Snapshot requested by alice (before-upgrade) failed: VirtualMachine web does not exist",
		},
		"its VM opted out": {
			snap: request(v1alpha1.PhasePending), in: Inputs{VM: vm(nil)},
			phase: v1alpha1.PhaseFailed, message: "is not backed up by guestbackup: annotate it with guestbackup.io/server",
			events: "Warning SnapshotRequestFailed",
		},
		"no path anywhere": {
			snap: request(""), in: Inputs{VM: vm(map[string]string{v1alpha1.AnnotationServer: "backup/main"}), Server: server, Admitted: true},
			phase: v1alpha1.PhaseFailed, message: "the request names no path and the VM has no annotation guestbackup.io/paths: set spec.paths",
			events: "Warning SnapshotRequestFailed",
		},
		"its VM's server does not exist": {
			snap: request(""), in: Inputs{VM: vm(optedIn)},
			phase: v1alpha1.PhaseFailed, message: "BackupStorageLocationServer backup/main, which VirtualMachine web's annotation guestbackup.io/server names, does not exist",
			events: "Warning SnapshotRequestFailed",
		},
		"its namespace is not admitted by the server": {
			snap: request(""), in: Inputs{VM: vm(optedIn), Server: server},
			phase: v1alpha1.PhaseFailed, message: "BackupStorageLocationServer backup/main does not admit namespace team-a",
			events: "Warning SnapshotRequestFailed",
		},
		"its server publishes no client port": {
			snap: request(""), in: Inputs{VM: vm(optedIn), Server: &v1alpha1.BackupStorageLocationServer{}, Admitted: true},
			phase: v1alpha1.PhaseFailed, message: "carries no requests",
			events: "Warning SnapshotRequestFailed",
		},
		"a tag that poses as the request's own": {
			snap: func() *v1alpha1.GuestSnapshot {
				s := request("")
				s.Spec.Tags = map[string]string{"guestbackup-request": "another-uid"}
				return s
			}(), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true},
			phase: v1alpha1.PhaseFailed, message: `it cannot be handed to the guest: request ` + uid + `: tag "guestbackup-request" is not a tag a request may set`,
			events: "Warning SnapshotRequestFailed",
		},
		"too big to hand over": {
			snap: request("", func() []string {
				var paths []string
				for i := range 8 {
					paths = append(paths, "/"+strings.Repeat(string(rune('a'+i)), 4000))
				}
				return paths
			}()...), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true},
			phase: v1alpha1.PhaseFailed, message: "more than 16384: name fewer or shorter paths, tags and description",
			events: "Warning SnapshotRequestFailed",
		},
		"its own paths, though the VM has none": {
			snap: request("", "/srv"), in: Inputs{VM: vm(map[string]string{v1alpha1.AnnotationServer: "backup/main"}), Server: server, Admitted: true},
			phase: v1alpha1.PhasePending, events: "Normal SnapshotRequested",
		},
		"started by the guest": {
			snap: request(v1alpha1.PhasePending), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Running", Started: started})},
			phase: v1alpha1.PhaseRunning, message: "the guest is taking the snapshots",
			events: "Normal SnapshotStarted Snapshot requested by alice (before-upgrade) started in the guest",
		},
		"another request's result changes nothing": {
			snap: request(v1alpha1.PhasePending), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: "other", Phase: "Succeeded", Started: started, Ended: &ended})},
			phase: v1alpha1.PhasePending,
		},
		"taken": {
			snap: request(v1alpha1.PhaseRunning), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Succeeded", Started: started, Ended: &ended, Snapshots: []activity.Snapshot{
				{ID: "k1", Path: "/srv", Files: 3, Bytes: 2048}, {ID: "k2", Path: "/etc", Files: 1, Bytes: 1024},
			}})},
			phase: v1alpha1.PhaseSucceeded, message: "took 2 snapshot(s): 4 files, 3.0 KiB", snapshots: true,
			events: "Normal SnapshotTaken Snapshot requested by alice (before-upgrade) taken: /srv (k1), /etc (k2)",
		},
		"failed in the guest": {
			snap: request(v1alpha1.PhaseRunning), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Failed", Message: "remote requests are turned off in this guest", Started: started, Ended: &ended})},
			phase: v1alpha1.PhaseFailed, message: "remote requests are turned off in this guest",
			events: "Warning SnapshotRequestFailed Snapshot requested by alice (before-upgrade) failed: remote requests are turned off in this guest",
		},
		"ended: stays as it is, VM gone or not": {
			snap: request(v1alpha1.PhaseSucceeded), in: Inputs{},
			phase: v1alpha1.PhaseSucceeded,
		},
	} {
		t.Run(name, func(t *testing.T) {
			tt.in.Now, tt.in.Request, tt.in.Status = now, SnapshotRequest(tt.snap), SnapshotStatus(tt.snap.Status)
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
			if tt.phase == v1alpha1.PhaseFailed && tt.snap.Status.Phase != v1alpha1.PhaseFailed && d.Status.CompletionTime == nil {
				t.Error("a failure without a completion time")
			}
		})
	}
}

func restoreOf(phase v1alpha1.RequestPhase, change func(*v1alpha1.GuestRestoreSpec)) *v1alpha1.GuestRestore {
	g := &v1alpha1.GuestRestore{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "nginx-config", UID: types.UID(uid)},
		Spec:       v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/nginx"}, Requester: &v1alpha1.Requester{Username: "alice"}},
		Status:     v1alpha1.GuestRestoreStatus{Phase: phase},
	}
	change(&g.Spec)
	return g
}

// A GuestRestore follows its guest as a GuestSnapshot does, and says what
// it restored, from which snapshot, where, and for whom. A restore into a
// claim is a Job's: the decision creates the Job (and a claim asked for),
// follows the Job's result as a guest's, and fails the request, saying
// why, when the claim cannot be written or the Job fails before it told
// how the restore ended.
func TestDecideRestore(t *testing.T) {
	ended := now.Add(-10 * time.Second)
	plan := []activity.Snapshot{{ID: "k1", Path: "/etc/nginx", Root: "/etc", Files: 3, Bytes: 2048}}
	same := func(*v1alpha1.GuestRestoreSpec) {}
	existing := func(s *v1alpha1.GuestRestoreSpec) {
		s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "data"}
	}
	fresh := func(s *v1alpha1.GuestRestoreSpec) {
		s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{Size: ptr.To(resource.MustParse("1Gi"))}
	}
	const job = "guestbackup-restore-" + uid
	for name, tt := range map[string]struct {
		restore                *v1alpha1.GuestRestore
		in                     Inputs
		phase                  v1alpha1.RequestPhase
		message, events        string
		files                  int64
		createJob, createClaim bool
	}{
		"new: handed to the server": {
			restore: restoreOf("", same), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true},
			phase: v1alpha1.PhasePending, message: "waiting for the guest of VirtualMachine web",
			events: "Normal RestoreRequested Restore requested by alice (nginx-config)",
		},
		"from another VM whose grant has gone since": {
			restore: restoreOf(v1alpha1.PhasePending, func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old" }),
			in:      Inputs{VM: vm(optedIn), Server: server, Admitted: true},
			phase:   v1alpha1.PhaseFailed, message: "VirtualMachine web may no longer read the snapshots of old",
			events: "Warning RestoreRequestFailed",
		},
		"started, from the snapshot its server chose": {
			restore: restoreOf(v1alpha1.PhasePending, same),
			in:      Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Running", Started: started, Snapshots: plan})},
			phase:   v1alpha1.PhaseRunning, message: "the guest is restoring",
			events: "Normal RestoreStarted Restore requested by alice (nginx-config) started in the guest: /etc/nginx (k1) into /var/lib/guestbackup/restores/nginx-config in the guest",
		},
		"restored in place": {
			restore: restoreOf(v1alpha1.PhaseRunning, func(s *v1alpha1.GuestRestoreSpec) { s.Target.InPlace = true }),
			in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Succeeded", Started: started, Ended: &ended, Snapshots: plan,
				Message: "/etc/nginx: Restored 3 files"})},
			phase: v1alpha1.PhaseSucceeded, message: "restored 3 files, 2.0 KiB in place in the guest", files: 3,
			events: "Normal Restored Restore requested by alice (nginx-config) restored /etc/nginx (k1) in place in the guest",
		},
		"restored from another VM's snapshots into a folder": {
			restore: restoreOf(v1alpha1.PhaseRunning, func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old"; s.Target.Directory = "/srv/back/" }),
			in: Inputs{VM: vm(map[string]string{v1alpha1.AnnotationServer: "backup/main", v1alpha1.AnnotationRestoreFrom: "old"}), Server: server, Admitted: true,
				Guest: guest(activity.Result{UID: uid, Phase: "Succeeded", Started: started, Ended: &ended, Snapshots: plan})},
			phase: v1alpha1.PhaseSucceeded, message: "restored 3 files, 2.0 KiB from VirtualMachine old's snapshots into /srv/back in the guest", files: 3,
			events: "Normal Restored Restore requested by alice (nginx-config) restored /etc/nginx (k1) from VirtualMachine old's snapshots into /srv/back in the guest",
		},
		"a dry run, listed by the server": {
			restore: restoreOf(v1alpha1.PhasePending, func(s *v1alpha1.GuestRestoreSpec) { s.DryRun = true }),
			in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Succeeded", Started: started, Ended: &ended, Snapshots: plan,
				Listing: &activity.Listing{Files: 3, Bytes: 2048, Truncated: true, Entries: []activity.Entry{{Path: "/var/lib/guestbackup/restores/nginx-config/etc/nginx", Type: "directory", Size: 2048, ModTime: started}}}})},
			phase: v1alpha1.PhaseSucceeded, message: "a dry run: restoring would write 3 files, 2.0 KiB into /var/lib/guestbackup/restores/nginx-config in the guest; nothing was written",
			events: "Normal RestoreListed Restore requested by alice (nginx-config) listed (a dry run): /etc/nginx (k1) would be restored into /var/lib/guestbackup/restores/nginx-config in the guest",
		},
		"a history, listed by the server": {
			restore: restoreOf(v1alpha1.PhasePending, func(s *v1alpha1.GuestRestoreSpec) {
				s.DryRun, s.History, s.Paths = true, true, []string{"/etc/nginx/nginx.conf"}
			}),
			in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Succeeded", Started: started, Ended: &ended,
				History: []activity.Version{
					{ID: "k3", Start: started, Type: "file", Size: 30, ModTime: started, Changed: true},
					{ID: "k2", Start: started.Add(-time.Hour), Type: "file", Size: 20, ModTime: started.Add(-time.Hour)},
				}})},
			phase: v1alpha1.PhaseSucceeded, message: "listed 2 versions of /etc/nginx/nginx.conf, newest first; nothing was written",
			events: "Normal RestoreListed Restore requested by alice (nginx-config) listed the versions of /etc/nginx/nginx.conf: 2, newest first",
		},
		"failed in the guest: nothing counted as written": {
			restore: restoreOf(v1alpha1.PhaseRunning, same),
			in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Guest: guest(activity.Result{UID: uid, Phase: "Failed", Started: started, Ended: &ended, Snapshots: plan,
				Message: "the restore failed in the guest: /etc/nginx: /var/lib/guestbackup/restores/nginx-config/etc/nginx exists already"})},
			phase: v1alpha1.PhaseFailed, message: "exists already",
			events: "Warning RestoreRequestFailed Restore requested by alice (nginx-config) failed: the restore failed in the guest",
		},
		"new, into an existing claim: the Job is created": {
			restore: restoreOf("", existing), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Claim: "data"}},
			phase: v1alpha1.PhasePending, message: "waiting for Job " + job + " to restore under VirtualMachine web's identity",
			events: "Normal RestoreRequested Restore requested by alice (nginx-config)", createJob: true,
		},
		"new, into a new claim: the claim and the Job are created": {
			restore: restoreOf("", fresh), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Claim: "nginx-config", CreateClaim: true}},
			phase: v1alpha1.PhasePending, message: "waiting for Job", events: "Normal RestoreRequested", createJob: true, createClaim: true,
		},
		"the claim cannot be written": {
			restore: restoreOf("", existing), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Claim: "data", ClaimProblem: "PersistentVolumeClaim data does not exist in namespace team-a: create it"}},
			phase: v1alpha1.PhaseFailed, message: "PersistentVolumeClaim data does not exist",
			events: "Warning RestoreRequestFailed Restore requested by alice (nginx-config) failed: PersistentVolumeClaim data does not exist",
		},
		"the Job's pod does not run: the status says why": {
			restore: restoreOf(v1alpha1.PhasePending, existing), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Exists: true, Claim: "data",
				Waiting: `CreateContainerConfigError: secret "web-guestbackup" not found`}},
			phase: v1alpha1.PhasePending, message: "waiting for Job " + job + " to restore under VirtualMachine web's identity: its pod does not run yet: CreateContainerConfigError: secret \"web-guestbackup\" not found",
		},
		"the Job exists: nothing more is created": {
			restore: restoreOf(v1alpha1.PhasePending, fresh), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Exists: true, Claim: "nginx-config"}},
			phase: v1alpha1.PhasePending,
		},
		"started by the Job": {
			restore: restoreOf(v1alpha1.PhasePending, existing),
			in:      Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Exists: true, Claim: "data"}, Guest: guest(activity.Result{UID: uid, Phase: "Running", Started: started, Snapshots: plan})},
			phase:   v1alpha1.PhaseRunning, message: "Job " + job + " is restoring",
			events: "Normal RestoreStarted Restore requested by alice (nginx-config) started by Job " + job + ": /etc/nginx (k1) into folder /nginx-config of PersistentVolumeClaim data",
		},
		"restored by the Job": {
			restore: restoreOf(v1alpha1.PhaseRunning, existing),
			in:      Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Exists: true, Claim: "data"}, Guest: guest(activity.Result{UID: uid, Phase: "Succeeded", Started: started, Ended: &ended, Snapshots: plan})},
			phase:   v1alpha1.PhaseSucceeded, message: "restored 3 files, 2.0 KiB into folder /nginx-config of PersistentVolumeClaim data", files: 3,
			events: "Normal Restored Restore requested by alice (nginx-config) restored /etc/nginx (k1) into folder /nginx-config of PersistentVolumeClaim data",
		},
		"the Job failed before it started": {
			restore: restoreOf(v1alpha1.PhasePending, existing), in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Exists: true, Claim: "data", Failed: "BackoffLimitExceeded: Job has reached the specified backoff limit"}},
			phase: v1alpha1.PhaseFailed, message: "Job " + job + " failed before it told how the restore ended (BackoffLimitExceeded: Job has reached the specified backoff limit): what it wrote into PersistentVolumeClaim data is unknown; kubectl logs -n team-a job/" + job + " says why",
			events: "Warning RestoreRequestFailed",
		},
		"the Job failed while it restored": {
			restore: restoreOf(v1alpha1.PhaseRunning, existing),
			in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Exists: true, Claim: "data", Failed: "DeadlineExceeded: Job was active longer than specified deadline"},
				Guest: guest(activity.Result{UID: uid, Phase: "Running", Started: started, Snapshots: plan})},
			phase: v1alpha1.PhaseFailed, message: "failed before it told how the restore ended (DeadlineExceeded", events: "Warning RestoreRequestFailed",
		},
		"the Job failed after it told the ending: the ending stands": {
			restore: restoreOf(v1alpha1.PhaseRunning, existing),
			in: Inputs{VM: vm(optedIn), Server: server, Admitted: true, Job: &JobState{Name: job, Exists: true, Claim: "data", Failed: "BackoffLimitExceeded"},
				Guest: guest(activity.Result{UID: uid, Phase: "Succeeded", Started: started, Ended: &ended, Snapshots: plan})},
			phase: v1alpha1.PhaseSucceeded, message: "restored 3 files", events: "Normal Restored", files: 3,
		},
	} {
		t.Run(name, func(t *testing.T) {
			tt.in.Now, tt.in.Request, tt.in.Status = now, RestoreRequest(tt.restore), RestoreStatus(tt.restore.Status)
			d := Decide(tt.in)
			if d.Status.Phase != tt.phase || !strings.Contains(d.Status.Message, tt.message) {
				t.Errorf("phase %q, message %q; want %q, %q", d.Status.Phase, d.Status.Message, tt.phase, tt.message)
			}
			var events []string
			for _, e := range d.Events {
				events = append(events, e.Type+" "+e.Reason+" "+e.Message)
			}
			if got := strings.Join(events, "\n"); !strings.HasPrefix(got, tt.events) || tt.events == "" && got != "" {
				t.Errorf("events %q, want %q", got, tt.events)
			}
			if d.Status.Files != tt.files {
				t.Errorf("files %d, want %d", d.Status.Files, tt.files)
			}
			if d.CreateJob != tt.createJob || d.CreateClaim != tt.createClaim {
				t.Errorf("creates the Job %v, the claim %v; want %v, %v", d.CreateJob, d.CreateClaim, tt.createJob, tt.createClaim)
			}
			var status v1alpha1.GuestRestoreStatus
			applyRestore(d.Status, &status)
			if tt.restore.Spec.History && (len(status.History) != 2 || status.History[0].SnapshotID != "k3" || !status.History[0].Changed ||
				status.History[1].Changed || status.History[1].Size != 20 || status.History[1].ModTime == nil || status.DryRun != nil) {
				t.Errorf("history %+v, dry run %+v: want the server's versions, newest first, and no listing", status.History, status.DryRun)
			}
			if tt.restore.Spec.DryRun && !tt.restore.Spec.History && (status.DryRun == nil || status.DryRun.Files != 3 || !status.DryRun.Truncated || len(status.DryRun.Entries) != 1 ||
				status.DryRun.Entries[0].Type != "directory" || status.DryRun.Entries[0].ModTime == nil) {
				t.Errorf("dry run %+v, want the server's listing", status.DryRun)
			}
			if tt.phase != v1alpha1.PhasePending && tt.phase != v1alpha1.PhaseFailed && !tt.restore.Spec.History && (len(status.Snapshots) != 1 || status.Snapshots[0].ID != "k1" || status.StartTime == nil) {
				t.Errorf("status %+v names not the snapshot it restores from", status)
			}
		})
	}
}

// A running restore reports what it wrote so far: what the snapshots of
// the paths its carrier says it restored hold, never more than its plan,
// with no Event for the progress itself.
func TestDecideRestoreProgress(t *testing.T) {
	plan := []activity.Snapshot{
		{ID: "k1", Path: "/etc/nginx", Root: "/etc", Files: 3, Bytes: 2048},
		{ID: "k1", Path: "/srv/www", Root: "/srv", Files: 7, Bytes: 1 << 20},
	}
	same := func(*v1alpha1.GuestRestoreSpec) {}
	running := func(restored int) *activity.Guest {
		return guest(activity.Result{UID: uid, Phase: "Running", Started: started, Snapshots: plan, Restored: restored})
	}
	const job = "guestbackup-restore-" + uid
	for name, tt := range map[string]struct {
		restore      *v1alpha1.GuestRestore
		in           Inputs
		message      string
		files, bytes int64
		events       string
	}{
		"started: nothing restored yet": {
			restore: restoreOf(v1alpha1.PhaseRunning, same), in: Inputs{Guest: running(0)},
			message: "the guest is restoring",
		},
		"one path of two restored": {
			restore: restoreOf(v1alpha1.PhaseRunning, same), in: Inputs{Guest: running(1)},
			message: "the guest is restoring: 1 of 2 paths restored so far", files: 3, bytes: 2048,
		},
		"progress seen with the start: both told": {
			restore: restoreOf(v1alpha1.PhasePending, same), in: Inputs{Guest: running(1)},
			message: "the guest is restoring: 1 of 2 paths restored so far", files: 3, bytes: 2048,
			events: "Normal RestoreStarted Restore requested by alice (nginx-config) started in the guest",
		},
		"a record beyond the plan counts the plan only": {
			restore: restoreOf(v1alpha1.PhaseRunning, same), in: Inputs{Guest: running(9)},
			message: "the guest is restoring: 2 of 2 paths restored so far", files: 10, bytes: 2048 + 1<<20,
		},
		"a Job's": {
			restore: restoreOf(v1alpha1.PhaseRunning, func(s *v1alpha1.GuestRestoreSpec) {
				s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "data"}
			}),
			in:      Inputs{Guest: running(1), Job: &JobState{Name: job, Exists: true, Claim: "data"}},
			message: "Job " + job + " is restoring: 1 of 2 paths restored so far", files: 3, bytes: 2048,
		},
	} {
		t.Run(name, func(t *testing.T) {
			tt.in.VM, tt.in.Server, tt.in.Admitted, tt.in.Now = vm(optedIn), server, true, now
			tt.in.Request, tt.in.Status = RestoreRequest(tt.restore), RestoreStatus(tt.restore.Status)
			d := Decide(tt.in)
			if d.Status.Phase != v1alpha1.PhaseRunning || d.Status.Message != tt.message {
				t.Errorf("phase %q, message %q; want Running, %q", d.Status.Phase, d.Status.Message, tt.message)
			}
			if d.Status.Files != tt.files || d.Status.Bytes != tt.bytes {
				t.Errorf("so far %d files, %d bytes; want %d, %d", d.Status.Files, d.Status.Bytes, tt.files, tt.bytes)
			}
			var events []string
			for _, e := range d.Events {
				events = append(events, e.Type+" "+e.Reason+" "+e.Message)
			}
			if got := strings.Join(events, "\n"); tt.events == "" && got != "" || !strings.HasPrefix(got, tt.events) {
				t.Errorf("events %q, want %q", got, tt.events)
			}
		})
	}
}
