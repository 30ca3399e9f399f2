package requeststatus

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// A tenant who can write ConfigMaps in a namespace of theirs, and points a
// VM's annotation at a "server" there, cannot make up its guest's results:
// only the activity ConfigMap its BSLS controls counts.
func TestGuestOfReadsOnlyTheServersOwnActivity(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	vm := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web"}}
	forged := activity.Encode(map[string]activity.Guest{"web@team-a": {User: "web@team-a", Results: []activity.Result{{UID: uid, Phase: "Succeeded"}}}})
	activityOf := func(namespace, name string, owner *metav1.OwnerReference) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: activity.ConfigMapName(name, userset.ShardOf("web@team-a")), Labels: map[string]string{activity.Label: name}},
			Data:       map[string]string{activity.Key: string(forged)},
		}
		if owner != nil {
			cm.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return cm
	}
	real := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main", UID: "bsls-uid"}}
	fake1 := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "fake", UID: "fake-uid"}}
	owned := &metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "BackupStorageLocationServer", Name: "main", UID: "bsls-uid", Controller: ptr.To(true)}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		activityOf("backup", "main", owned),
		// The tenant's own, labelled as the server's, owned by nothing.
		activityOf("team-a", "fake", nil),
	).Build()
	r := &Reconciler{Client: c}

	g, err := r.guestOf(context.Background(), vm, real)
	if err != nil || g == nil || len(g.Results) != 1 {
		t.Fatalf("the server's own activity: %+v, %v", g, err)
	}
	g, err = r.guestOf(context.Background(), vm, fake1)
	if err != nil || g != nil {
		t.Errorf("a ConfigMap the BSLS does not control was read as its activity: %+v, %v", g, err)
	}
}
