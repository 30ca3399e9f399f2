package audit

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
)

// reported is a guest that never snapshotted and reported a problem with
// its client at at.
func reported(kind string, at time.Time) *activity.Guest {
	return &activity.Guest{User: "web@team-a", Report: &activity.Report{Kind: kind, Message: "its SHA-256 is 00, not 11; it was not run", At: at}}
}

func TestDecide(t *testing.T) {
	issued := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	snap := func(id string, end time.Time) *activity.Guest {
		return &activity.Guest{User: "web@team-a", Snapshots: 3, First: issued.Add(time.Hour),
			Last: activity.Snapshot{ID: id, Path: "/etc", Start: end.Add(-2 * time.Second), End: end, Bytes: 4096, Files: 12}}
	}
	daily := map[string]string{v1alpha1.AnnotationPaths: "/etc"}
	tests := []struct {
		name       string
		vm, seen   map[string]string
		guest      *activity.Guest
		now        time.Time
		reasons    []string
		recheck    time.Duration
		annotation map[string]string
	}{
		{name: "nothing yet, within the window", vm: daily, now: issued.Add(time.Hour), recheck: 47 * time.Hour},
		{name: "nothing yet, and the window passed", vm: daily, now: issued.Add(49 * time.Hour),
			reasons: []string{ReasonBackupStale}, annotation: map[string]string{AnnotationBackupStale: "true"}},
		{name: "stale already announced", vm: daily, seen: map[string]string{AnnotationBackupStale: "true"}, now: issued.Add(50 * time.Hour)},
		{name: "the first snapshot", vm: daily, guest: snap("a", issued.Add(time.Hour)), now: issued.Add(2 * time.Hour),
			reasons: []string{ReasonGuestConnected, ReasonSnapshotCreated}, recheck: 47 * time.Hour, annotation: map[string]string{AnnotationLastSnapshot: "a"}},
		{name: "a snapshot already announced", vm: daily, seen: map[string]string{AnnotationLastSnapshot: "a"}, guest: snap("a", issued.Add(time.Hour)), now: issued.Add(2 * time.Hour), recheck: 47 * time.Hour},
		{name: "a new snapshot", vm: daily, seen: map[string]string{AnnotationLastSnapshot: "a"}, guest: snap("b", issued.Add(25*time.Hour)), now: issued.Add(26 * time.Hour),
			reasons: []string{ReasonSnapshotCreated}, recheck: 47 * time.Hour, annotation: map[string]string{AnnotationLastSnapshot: "b"}},
		{name: "resumed after stale", vm: daily, seen: map[string]string{AnnotationLastSnapshot: "a", AnnotationBackupStale: "true"}, guest: snap("c", issued.Add(80*time.Hour)), now: issued.Add(80 * time.Hour),
			reasons: []string{ReasonSnapshotCreated, ReasonBackupResumed}, recheck: 48 * time.Hour, annotation: map[string]string{AnnotationLastSnapshot: "c", AnnotationBackupStale: ""}},
		{name: "hourly schedule", vm: map[string]string{v1alpha1.AnnotationPaths: "/etc", v1alpha1.AnnotationSchedule: "hourly"}, now: issued.Add(3 * time.Hour),
			reasons: []string{ReasonBackupStale}, annotation: map[string]string{AnnotationBackupStale: "true"}},
		{name: "a calendar expression uses the default", vm: map[string]string{v1alpha1.AnnotationPaths: "/etc", v1alpha1.AnnotationSchedule: "Mon *-*-* 02:00"}, now: issued.Add(10 * time.Hour), recheck: 2 * time.Hour},
		{name: "no paths: only connects, never stale", vm: map[string]string{}, now: issued.Add(1000 * time.Hour)},
		{name: "a guest refused a tampered client", vm: map[string]string{}, guest: reported(clientdist.ReportChecksumMismatch, issued), now: issued.Add(time.Hour),
			reasons: []string{ReasonClientChecksumMismatch}, annotation: map[string]string{AnnotationClientReport: "checksum-mismatch@2026-11-20T12:00:00Z"}},
		{name: "a guest's pre-snapshot hook failed", vm: map[string]string{}, guest: reported(clientdist.ReportHookFailed, issued), now: issued.Add(time.Hour),
			reasons: []string{ReasonSnapshotHookFailed}, annotation: map[string]string{AnnotationClientReport: "hook-failed@2026-11-20T12:00:00Z"}},
		{name: "a report already announced", vm: map[string]string{}, seen: map[string]string{AnnotationClientReport: "checksum-mismatch@2026-11-20T12:00:00Z"},
			guest: reported(clientdist.ReportChecksumMismatch, issued), now: issued.Add(time.Hour)},
		{name: "a later report", vm: map[string]string{}, seen: map[string]string{AnnotationClientReport: "checksum-mismatch@2026-11-20T12:00:00Z"},
			guest: reported(clientdist.ReportDownloadFailed, issued.Add(24*time.Hour)), now: issued.Add(25 * time.Hour),
			reasons: []string{ReasonClientDownloadFailed}, annotation: map[string]string{AnnotationClientReport: "download-failed@2026-11-21T12:00:00Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.vm, tt.seen, tt.guest, issued, tt.now, 12*time.Hour)
			var reasons []string
			for _, e := range d.Events {
				reasons = append(reasons, e.Reason)
				if strings.Contains(e.Message, "password") {
					t.Errorf("event %s mentions a password", e.Reason)
				}
			}
			if strings.Join(reasons, ",") != strings.Join(tt.reasons, ",") {
				t.Errorf("events %v, want %v", reasons, tt.reasons)
			}
			if d.RecheckAfter != tt.recheck {
				t.Errorf("recheck after %v, want %v", d.RecheckAfter, tt.recheck)
			}
			if len(d.Annotations) != len(tt.annotation) {
				t.Errorf("annotations %v, want %v", d.Annotations, tt.annotation)
			}
			for k, v := range tt.annotation {
				if got, ok := d.Annotations[k]; !ok || got != v {
					t.Errorf("annotation %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestSnapshotCreatedSaysPathAndSize(t *testing.T) {
	end := time.Date(2026, 11, 23, 2, 0, 0, 0, time.UTC)
	g := &activity.Guest{User: "web@team-a", Snapshots: 1, First: end, Last: activity.Snapshot{ID: "k1", Path: "/srv/data", Start: end.Add(-1500 * time.Millisecond), End: end, Bytes: 123456, Files: 7}}
	d := Decide(nil, nil, g, end, end, time.Hour)
	want := "Snapshot k1 of /srv/data: 123456 bytes in 7 files, taken in 1.5s, ended 2026-11-23T02:00:00Z; snapshots kept: 1"
	if len(d.Events) != 2 || d.Events[1].Message != want {
		t.Errorf("events %+v, want SnapshotCreated %q", d.Events, want)
	}
}

func TestDecideConnection(t *testing.T) {
	start := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	inst := &Instance{UID: "vmi-1", Started: start}
	next := &Instance{UID: "vmi-2", Started: start.Add(time.Hour)}
	paths := map[string]string{v1alpha1.AnnotationPaths: "/etc"}
	first := &activity.Guest{User: "web@team-a", Snapshots: 1, First: start, Last: activity.Snapshot{ID: "a", End: start.Add(2 * time.Minute)}}
	tests := []struct {
		name       string
		vm, seen   map[string]string
		guest      *activity.Guest
		inst       *Instance
		issued     time.Time
		now        time.Time
		warn       bool
		recheck    time.Duration
		annotation map[string]string
	}{
		{name: "running, within the delay", vm: paths, inst: inst, now: start.Add(5 * time.Minute), recheck: 10 * time.Minute},
		{name: "running, the delay passed", vm: paths, inst: inst, now: start.Add(15 * time.Minute), warn: true,
			annotation: map[string]string{AnnotationNotConnected: "vmi-1"}},
		{name: "already warned for this instance", vm: paths, seen: map[string]string{AnnotationNotConnected: "vmi-1"}, inst: inst, now: start.Add(time.Hour)},
		{name: "a new instance waits its own delay", vm: paths, seen: map[string]string{AnnotationNotConnected: "vmi-1"}, inst: next, now: start.Add(time.Hour + time.Minute), recheck: 14 * time.Minute},
		{name: "a new instance is warned about again", vm: paths, seen: map[string]string{AnnotationNotConnected: "vmi-1"}, inst: next, now: start.Add(2 * time.Hour), warn: true,
			annotation: map[string]string{AnnotationNotConnected: "vmi-2"}},
		{name: "stopped: nothing to wait for", vm: paths, now: start.Add(time.Hour)},
		{name: "stopped after a warning: the warning stays", vm: paths, seen: map[string]string{AnnotationNotConnected: "vmi-1"}, now: start.Add(time.Hour)},
		{name: "the first snapshot clears the warning", vm: paths, seen: map[string]string{AnnotationNotConnected: "vmi-1"}, guest: first, inst: inst, now: start.Add(time.Hour),
			annotation: map[string]string{AnnotationNotConnected: ""}},
		{name: "connected before: never judged again", vm: paths, seen: map[string]string{AnnotationLastSnapshot: "a"}, inst: next, now: start.Add(10 * time.Hour)},
		{name: "no paths: nothing the server keeps tells", vm: map[string]string{}, inst: inst, now: start.Add(10 * time.Hour)},
		{name: "paths removed after a warning", vm: map[string]string{}, seen: map[string]string{AnnotationNotConnected: "vmi-1"}, inst: inst, now: start.Add(10 * time.Hour),
			annotation: map[string]string{AnnotationNotConnected: ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			issued := tt.issued
			if issued.IsZero() {
				issued = start.Add(-time.Minute)
			}
			d := DecideConnection(Connection{VMAnnotations: tt.vm, Announced: tt.seen, Guest: tt.guest, Instance: tt.inst,
				Issued: issued, User: "web@team-a", Server: "backup/main", Now: tt.now, After: 15 * time.Minute})
			if got := len(d.Events) == 1 && d.Events[0].Reason == ReasonGuestNotConnected && d.Events[0].Type == "Warning"; got != tt.warn || len(d.Events) > 1 {
				t.Errorf("events %+v, want a GuestNotConnected warning: %v", d.Events, tt.warn)
			}
			if d.RecheckAfter != tt.recheck {
				t.Errorf("recheck after %v, want %v", d.RecheckAfter, tt.recheck)
			}
			if !maps.Equal(d.Annotations, tt.annotation) {
				t.Errorf("annotations %v, want %v", d.Annotations, tt.annotation)
			}
		})
	}
}

func TestGuestNotConnectedSaysWhy(t *testing.T) {
	start := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	d := DecideConnection(Connection{VMAnnotations: map[string]string{v1alpha1.AnnotationPaths: "/etc"}, Instance: &Instance{UID: "u", Started: start},
		Issued: start.Add(time.Minute), User: "web@team-a", Server: "backup/main", Now: start.Add(time.Hour), After: 15 * time.Minute})
	if len(d.Events) != 1 {
		t.Fatalf("events %+v", d.Events)
	}
	for _, want := range []string{
		"BackupStorageLocationServer backup/main as web@team-a within 15m0s of the VM's start at 2026-11-25T09:00:00Z",
		"this instance started before its credentials were issued at 2026-11-25T09:01:00Z, so its guest has none: restart the VM",
		"cannot reach the server's URL", "kopia is missing", "journalctl -u guestbackup-connect",
	} {
		if !strings.Contains(d.Events[0].Message, want) {
			t.Errorf("message %q lacks %q", d.Events[0].Message, want)
		}
	}
}

// TestShardsDecodeEachVersionOnce: the VMs of a shard share one decoding of
// its ConfigMap per version; a new version is decoded again, a ConfigMap
// that is gone is forgotten.
func TestShardsDecodeEachVersionOnce(t *testing.T) {
	key := types.NamespacedName{Namespace: "backup", Name: activity.ConfigMapName("main", 3)}
	at := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	cm := func(version string, users ...string) *corev1.ConfigMap {
		guests := map[string]activity.Guest{}
		for _, u := range users {
			guests[u] = activity.Guest{User: u, Snapshots: 1, First: at, Last: activity.Snapshot{ID: "k1", End: at}}
		}
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, ResourceVersion: version},
			Data: map[string]string{activity.Key: string(activity.Encode(guests))}}
	}
	var s shards
	decoded := func(c *corev1.ConfigMap) []string {
		t.Helper()
		d, err := s.decode(key, c)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Sorted(maps.Keys(d.guests))
	}
	if got := decoded(cm("1", "a@ns", "b@ns")); !slices.Equal(got, []string{"a@ns", "b@ns"}) {
		t.Fatalf("version 1: %v", got)
	}
	// The same version is not decoded again (its data cannot differ).
	if got := decoded(cm("1", "c@ns")); !slices.Equal(got, []string{"a@ns", "b@ns"}) {
		t.Errorf("version 1 again: %v, want what was decoded of it", got)
	}
	if got := decoded(cm("2", "c@ns")); !slices.Equal(got, []string{"c@ns"}) {
		t.Errorf("version 2: %v", got)
	}
	s.forget(key)
	if _, held := s.decoded[key]; held {
		t.Error("a ConfigMap that is gone is still held")
	}
	if _, err := s.decode(key, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "3"}, Data: map[string]string{activity.Key: "not json\n"}}); err == nil {
		t.Error("an unreadable ConfigMap decoded")
	}
}
