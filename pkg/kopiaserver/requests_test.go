package kopiaserver

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// A server's guests are handed the requests the request reconciler admitted
// or they started, of both kinds, for VMs whose user it serves, with their
// paths; a restore a running guest cannot carry is not handed out.
func TestQueueRequests(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC))
	snap := func(name, vm string, phase v1alpha1.RequestPhase, paths ...string) v1alpha1.GuestSnapshot {
		return v1alpha1.GuestSnapshot{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("0000000" + name[:1] + "-0000-4000-8000-000000000000"), CreationTimestamp: at},
			Spec:       v1alpha1.GuestSnapshotSpec{VM: vm, Paths: paths, Tags: map[string]string{"why": "test"}},
			Status:     v1alpha1.GuestSnapshotStatus{Phase: phase},
		}
	}
	vms := map[types.NamespacedName]*metav1.PartialObjectMetadata{
		{Namespace: "team-a", Name: "web"}:   {ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationPaths: "/srv/,/etc"}}},
		{Namespace: "team-a", Name: "db"}:    {ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}},
		{Namespace: "team-a", Name: "gone"}:  nil,
		{Namespace: "team-a", Name: "other"}: {ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationPaths: "/srv"}}},
	}
	var users UserSet
	for i := range users.Shards {
		users.Shards[i] = map[string]identity.Hash{}
	}
	for _, u := range []string{"web@team-a", "db@team-a", "gone@team-a"} {
		users.Shards[userset.ShardOf(u)][u] = identity.Hash{}
	}
	restore := func(name, vm string, phase v1alpha1.RequestPhase, target v1alpha1.RestoreTarget) v1alpha1.GuestRestore {
		return v1alpha1.GuestRestore{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(fmt.Sprintf("%08x-0000-4000-8000-000000000000", name[0])), CreationTimestamp: at},
			Spec:       v1alpha1.GuestRestoreSpec{VM: vm, Paths: []string{"/srv/a.txt"}, Target: target},
			Status:     v1alpha1.GuestRestoreStatus{Phase: phase},
		}
	}
	got := QueueRequests(Requests{Snapshots: []v1alpha1.GuestSnapshot{
		snap("a-pending", "web", v1alpha1.PhasePending),
		snap("b-running", "db", v1alpha1.PhaseRunning, "/var/lib/db"),
		snap("c-new", "web", ""),
		snap("d-done", "web", v1alpha1.PhaseSucceeded),
		snap("e-failed", "web", v1alpha1.PhaseFailed),
		snap("f-no-paths", "db", v1alpha1.PhasePending),
		snap("g-gone", "gone", v1alpha1.PhasePending, "/srv"),
		snap("h-other-server", "other", v1alpha1.PhasePending),
	}, Restores: []v1alpha1.GuestRestore{
		restore("i-restore", "web", v1alpha1.PhasePending, v1alpha1.RestoreTarget{}),
		restore("j-in-place", "web", v1alpha1.PhaseRunning, v1alpha1.RestoreTarget{InPlace: true}),
		restore("k-claim", "web", v1alpha1.PhasePending, v1alpha1.RestoreTarget{PersistentVolumeClaim: &v1alpha1.RestoreClaim{ClaimName: "data"}}),
		restore("l-done", "web", v1alpha1.PhaseSucceeded, v1alpha1.RestoreTarget{}),
		restore("m-other-server", "other", v1alpha1.PhasePending, v1alpha1.RestoreTarget{}),
	}}, vms, users)
	want := []userset.Queued{
		{Request: userset.Request{UID: "0000000a-0000-4000-8000-000000000000", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "a-pending", Paths: []string{"/srv", "/etc"}, Tags: map[string]string{"why": "test"}}, Order: "2026-12-07T08:00:00Z/a-pending"},
		{Request: userset.Request{UID: "0000000b-0000-4000-8000-000000000000", User: "db@team-a", Kind: userset.RequestSnapshot, Name: "b-running", Paths: []string{"/var/lib/db"}, Tags: map[string]string{"why": "test"}}, Order: "2026-12-07T08:00:00Z/b-running"},
		{Request: userset.Request{UID: "00000069-0000-4000-8000-000000000000", User: "web@team-a", Kind: userset.RequestRestore, Name: "i-restore", Paths: []string{"/srv/a.txt"}, Source: "web@team-a", Target: "/var/lib/guestbackup/restores/i-restore"}, Order: "2026-12-07T08:00:00Z/i-restore"},
		{Request: userset.Request{UID: "0000006a-0000-4000-8000-000000000000", User: "web@team-a", Kind: userset.RequestRestore, Name: "j-in-place", Paths: []string{"/srv/a.txt"}, Source: "web@team-a", Target: "/", InPlace: true}, Order: "2026-12-07T08:00:00Z/j-in-place"},
		// A Job's, into the claim's folder of the request.
		{Request: userset.Request{UID: "0000006b-0000-4000-8000-000000000000", User: "web@team-a", Kind: userset.RequestRestore, Name: "k-claim", Paths: []string{"/srv/a.txt"}, Source: "web@team-a", Target: "/k-claim", Job: true}, Order: "2026-12-07T08:00:00Z/k-claim"},
	}
	if len(got) != len(want) {
		t.Fatalf("queued %d requests, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if string(userset.EncodeRequests([]userset.Request{got[i].Request})) != string(userset.EncodeRequests([]userset.Request{want[i].Request})) || got[i].Order != want[i].Order {
			t.Errorf("request %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
