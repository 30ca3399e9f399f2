package manager_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// TestOneFlappingWarningSilencesNoOther: a manager from NewManager records
// a Warning of one reason after 30 of another on the same object, which
// controller-runtime's own broadcaster drops (its spam filter allows 25
// Warnings per object, then one every 5 minutes); and it stops.
func TestOneFlappingWarningSilencesNoOther(t *testing.T) {
	api := testbed.StartAPIServer(t, testbed.APIServerOptions{})
	mgr, err := manager.NewManager(api.Config, ctrl.Options{
		Scheme:                 api.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the manager stopped with %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("the manager did not stop within a minute")
		}
	}()

	object := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "flapping"}}
	if err := api.Client.Create(ctx, object); err != nil {
		t.Fatal(err)
	}
	rec := mgr.GetEventRecorderFor("guestbackup-test")
	for i := range 30 {
		rec.Eventf(object, corev1.EventTypeWarning, "HashPending", "flap %d", i)
	}
	rec.Event(object, corev1.EventTypeWarning, "UserRefused", "the one an admin audits")
	// Written in order: once the marker (another object) is, UserRefused was or never will be.
	marker := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "marker"}}
	rec.Event(marker, corev1.EventTypeNormal, "Marker", "the end")
	written := func(name, reason string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			list := &corev1.EventList{}
			if err := api.Client.List(ctx, list, client.InNamespace("default")); err != nil {
				return false, fmt.Errorf("list Events: %w", err)
			}
			for _, e := range list.Items {
				if e.InvolvedObject.Name == name && e.Reason == reason {
					return true, nil
				}
			}
			return false, nil
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, written(marker.Name, "Marker")); err != nil {
		t.Fatalf("the marker Event was never written: %v", err)
	}
	if ok, err := written(object.Name, "UserRefused")(ctx); err != nil || !ok {
		t.Errorf("the UserRefused Event was not written (%v)", err)
	}
}
