package requeststatus

import (
	"context"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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

// A tenant who creates, under a restore's names, a Job or a claim of their
// own gets neither adopted: the Job is not taken for the request's, nor the
// claim written into; the request fails, saying what to do.
func TestRestoreJobNamesTakenByATenant(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, batchv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	g := restoreOf(v1alpha1.PhasePending, func(s *v1alpha1.GuestRestoreSpec) {
		s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{Size: ptr.To(resource.MustParse("1Gi"))}
	})
	tenantsJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: RestoreJobName(g),
		Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, LabelRestore: string(g.UID)}}}
	tenantsClaim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: g.Name}}
	in := Inputs{Server: server, Namespace: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: g.Namespace}}}

	// Seen in the cache.
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tenantsJob).Build()
	st, err := jobOf(ctx, c, g)
	if err != nil || st == nil || st.ClaimProblem != notOurs(RestoreJobName(g)) {
		t.Errorf("a tenant's Job of the request's Job's name: %+v, %v", st, err)
	}

	// Not in the cache (it holds guestbackup's alone): the create finds it.
	r := &Reconciler{Client: c, APIReader: c, Image: "guestbackup:dev"}
	problem, err := makeJob(ctx, r, g, in, Decision{CreateJob: true})
	if err != nil || problem != notOurs(RestoreJobName(g)) {
		t.Errorf("creating the Job over a tenant's: %q, %v", problem, err)
	}

	// A claim made between the cache's read and the create.
	c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(tenantsClaim).Build()
	r = &Reconciler{Client: c, APIReader: c, Image: "guestbackup:dev"}
	problem, err = makeJob(ctx, r, g, in, Decision{CreateClaim: true, CreateJob: true})
	if err != nil || !strings.Contains(problem, "exists already, and this request asks for a new one of that name") {
		t.Errorf("creating the claim over a tenant's: %q, %v", problem, err)
	}
	jobs := &batchv1.JobList{}
	if err := c.List(ctx, jobs); err != nil || len(jobs.Items) != 0 {
		t.Errorf("%d Jobs were made to write into the tenant's claim (%v)", len(jobs.Items), err)
	}
}
