package kopiaserver

import (
	"context"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// A JSON merge patch replaces the finalizers list as a whole: the BSLS's
// finalizers are patched against the resourceVersion the controller read,
// so that a finalizer another party added meanwhile is never dropped; the
// conflict is returned, and the reconcile retries from a fresh read.
func TestBSLSFinalizerPatchesKeepAnotherPartys(t *testing.T) {
	const theirs = "other.example.com/hold"
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		before []string
		patch  func(r *Reconciler, b *v1alpha1.BackupStorageLocationServer) error
		want   []string
	}{
		{"addFinalizer", nil, func(r *Reconciler, b *v1alpha1.BackupStorageLocationServer) error {
			return r.addFinalizer(context.Background(), b, FinalizerCAGuard)
		}, []string{theirs, FinalizerCAGuard}},
		{"finalizeWith", []string{FinalizerVeleroAccess}, func(r *Reconciler, b *v1alpha1.BackupStorageLocationServer) error {
			return r.finalizeWith(context.Background(), b, FinalizerVeleroAccess, func() error { return nil })
		}, []string{theirs}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key := client.ObjectKey{Namespace: "backup", Name: "main"}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&v1alpha1.BackupStorageLocationServer{
				ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Finalizers: tc.before},
			}).Build()
			r := &Reconciler{Client: c}
			seen := &v1alpha1.BackupStorageLocationServer{}
			if err := c.Get(ctx, key, seen); err != nil {
				t.Fatal(err)
			}
			// Another party adds its finalizer after the controller read.
			other := seen.DeepCopy()
			other.Finalizers = append(other.Finalizers, theirs)
			if err := c.Update(ctx, other); err != nil {
				t.Fatal(err)
			}

			if err := tc.patch(r, seen); !apierrors.IsConflict(err) {
				t.Errorf("patch from a stale read: error %v, want a conflict (retried from a fresh read)", err)
			}
			now := &v1alpha1.BackupStorageLocationServer{}
			if err := c.Get(ctx, key, now); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(now.Finalizers, theirs) {
				t.Fatalf("finalizers %v: the other party's %s was dropped", now.Finalizers, theirs)
			}

			if err := tc.patch(r, now); err != nil {
				t.Fatalf("patch from a fresh read: %v", err)
			}
			if err := c.Get(ctx, key, now); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(now.Finalizers, tc.want) {
				t.Errorf("finalizers %v, want %v", now.Finalizers, tc.want)
			}
		})
	}
}
