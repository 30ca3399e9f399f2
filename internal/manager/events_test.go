package manager_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// TestEvents: a manager from NewManager, against a real API server, as the
// controller runs it (with leader election) and as the webhook does
// (without), writes each Event once and lets no reason silence another.
func TestEvents(t *testing.T) {
	api := testbed.StartAPIServer(t, testbed.APIServerOptions{})
	for _, tc := range []struct {
		name string
		// record records on object, then the test waits for what it wrote.
		record func(rec record.EventRecorder, object *corev1.ConfigMap)
		reason string
		// count is the Event's count once written: 0, never written.
		count int32
	}{
		{
			// controller-runtime's own broadcaster drops it: its spam
			// filter allows 25 Warnings per object, then one every 5
			// minutes.
			name: "a Warning of one reason after 30 of another",
			record: func(rec record.EventRecorder, object *corev1.ConfigMap) {
				for i := range 30 {
					rec.Event(object, corev1.EventTypeWarning, "HashPending", fmt.Sprintf("flap %d", i))
				}
				rec.Event(object, corev1.EventTypeWarning, "UserRefused", "the one an admin audits")
			},
			reason: "UserRefused", count: 1,
		},
		{
			// Two sinks on one broadcaster (Options.EventBroadcaster, which
			// both of controller-runtime's recorder providers start, the
			// manager's for leader election) would each write the Event
			// that combines similar ones, under names of their own.
			name: "11 similar Events, the last one combined with the others",
			record: func(rec record.EventRecorder, object *corev1.ConfigMap) {
				for i := range 11 {
					rec.Event(object, corev1.EventTypeWarning, "UserRefused", fmt.Sprintf("Credential Secret %d refused", i))
				}
			},
			reason: "UserRefused", count: 11,
		},
	} {
		for _, leaderElection := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, leader election %v", tc.name, leaderElection), func(t *testing.T) {
				ns := fmt.Sprintf("events-%d", time.Now().UnixNano())
				if err := api.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
					t.Fatal(err)
				}
				o := testbed.ManagerOptions{}
				if leaderElection {
					o.LeaderElectionID, o.LeaderElectionNamespace = "events-test", ns
				}
				var mgr ctrl.Manager
				stop, err := testbed.RunManager(api, o, func(m ctrl.Manager) error { mgr = m; return nil })
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := stop(); err != nil {
						t.Errorf("the manager stopped with %v", err)
					}
				})
				object := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "object"}}
				if err := api.Client.Create(t.Context(), object); err != nil {
					t.Fatal(err)
				}
				rec := mgr.GetEventRecorderFor("guestbackup-test")
				tc.record(rec, object)
				// Written in order: once the marker (another object) is,
				// what came before it was, or never will be.
				marker := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "marker"}}
				rec.Event(marker, corev1.EventTypeNormal, "Marker", "the end")
				if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
					n, err := eventCount(ctx, api, marker, "Marker")
					return n > 0, err
				}); err != nil {
					t.Fatalf("the marker Event was never written: %v", err)
				}
				if n, err := eventCount(t.Context(), api, object, tc.reason); err != nil || n != tc.count {
					t.Errorf("the %s Event's count is %d (%v), want %d", tc.reason, n, err, tc.count)
				}
			})
		}
	}
}

// eventCount is the count of the Events of reason on object, summed.
func eventCount(ctx context.Context, api *testbed.APIServer, object client.Object, reason string) (int32, error) {
	list := &corev1.EventList{}
	if err := api.Client.List(ctx, list, client.InNamespace(object.GetNamespace())); err != nil {
		return 0, fmt.Errorf("list Events: %w", err)
	}
	var n int32
	for _, e := range list.Items {
		if e.InvolvedObject.Name == object.GetName() && e.Reason == reason {
			n += max(e.Count, 1)
		}
	}
	return n, nil
}
