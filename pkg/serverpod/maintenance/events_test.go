package maintenance

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// TestPublishKeepsEarlierRunsAcrossRestarts: a restarted pod whose first
// check finds nothing due publishes the next run without erasing the last
// run the previous pod published.
func TestPublishKeepsEarlierRunsAcrossRestarts(t *testing.T) {
	ctx := context.Background()
	earlier := metav1.NewTime(time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC))
	next := metav1.NewTime(earlier.Add(time.Hour))
	prev := v1alpha1.MaintenanceStatus{Owner: "o", LastRun: &earlier, LastCycle: "full", LastSuccess: &earlier}
	client := fake.NewClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: maintenancestate.ConfigMapName("store"), Namespace: "ns"},
		Data:       map[string]string{maintenancestate.Key: maintenancestate.Encode(prev)},
	})
	p := ConfigMapPublisher{ConfigMaps: client.CoreV1().ConfigMaps("ns"), BSLS: "store"}
	read := func() *v1alpha1.MaintenanceStatus {
		t.Helper()
		cm, err := p.ConfigMaps.Get(ctx, maintenancestate.ConfigMapName("store"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := maintenancestate.Decode(cm.Data[maintenancestate.Key])
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	if err := p.Publish(ctx, v1alpha1.MaintenanceStatus{Owner: "o", NextRun: &next}); err != nil {
		t.Fatal(err)
	}
	if s := read(); s.LastRun == nil || !s.LastRun.Equal(&earlier) || s.LastCycle != "full" || s.LastSuccess == nil || s.NextRun == nil {
		t.Fatalf("after a restart's first check: %+v; want the earlier run kept and the next run set", s)
	}

	later := metav1.NewTime(next.Time)
	if err := p.Publish(ctx, v1alpha1.MaintenanceStatus{Owner: "o", LastRun: &later, LastCycle: "quick", Failure: "boom"}); err != nil {
		t.Fatal(err)
	}
	if s := read(); !s.LastRun.Equal(&later) || s.LastCycle != "quick" || !s.LastSuccess.Equal(&earlier) || s.Failure != "boom" {
		t.Fatalf("after a failed run: %+v; want the new run, its failure, and the earlier success", s)
	}
}

// TestPublishRetriesAWriteConflict: the pod's client server writes its own
// key into the same ConfigMap; a publish that lost that race reads the
// ConfigMap again and writes, rather than leaving the BSLS's status a
// whole run behind.
func TestPublishRetriesAWriteConflict(t *testing.T) {
	ctx := context.Background()
	name := maintenancestate.ConfigMapName("store")
	client := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}})
	conflicts := 0
	client.PrependReactor("update", "configmaps", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		// The other writer's update lands between this publisher's read
		// and its write.
		other := action.(clienttesting.UpdateAction).GetObject().DeepCopyObject().(*corev1.ConfigMap)
		other.Data = map[string]string{"client": "theirs"}
		if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("configmaps"), other, "ns"); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewConflict(corev1.Resource("configmaps"), name, errors.New("the object has been modified"))
	})
	p := ConfigMapPublisher{ConfigMaps: client.CoreV1().ConfigMaps("ns"), BSLS: "store"}
	next := metav1.NewTime(time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC))

	if err := p.Publish(ctx, v1alpha1.MaintenanceStatus{Owner: "o", NextRun: &next}); err != nil {
		t.Fatalf("publish after one conflict: %v", err)
	}
	cm, err := p.ConfigMaps.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := maintenancestate.Decode(cm.Data[maintenancestate.Key]); err != nil || s == nil || s.NextRun == nil {
		t.Errorf("published state %q (%v); want the next run", cm.Data[maintenancestate.Key], err)
	}
	if cm.Data["client"] != "theirs" {
		t.Errorf("the other writer's key is %q; want it kept", cm.Data["client"])
	}
}
