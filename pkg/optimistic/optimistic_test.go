package optimistic

import (
	"context"
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

func TestPatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		// otherWriter adds a finalizer between the read and the patch.
		otherWriter  bool
		wantConflict bool
		want         []string
	}{
		{"onto the version read", false, false, []string{"a", "ours"}},
		{"onto a newer version", true, true, []string{"a", "theirs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			stored := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", Finalizers: []string{"a"}}}
			c := fake.NewClientBuilder().WithObjects(stored).Build()
			read := &corev1.Secret{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(stored), read); err != nil {
				t.Fatal(err)
			}
			if tc.otherWriter {
				other := read.DeepCopy()
				controllerutil.AddFinalizer(other, "theirs")
				if err := c.Update(ctx, other); err != nil {
					t.Fatal(err)
				}
			}
			err := Patch(ctx, c, read, func() { controllerutil.AddFinalizer(read, "ours") })
			if apierrors.IsConflict(err) != tc.wantConflict || (err != nil && !tc.wantConflict) {
				t.Fatalf("Patch: %v, want a conflict: %t", err, tc.wantConflict)
			}
			got := &corev1.Secret{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(stored), got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Finalizers, tc.want) {
				t.Errorf("finalizers %v, want %v", got.Finalizers, tc.want)
			}
		})
	}
}

func TestIgnoreConflict(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		kept bool
	}{
		{"none", nil, false},
		{"a conflict", apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, "s", errors.New("changed")), false},
		{"not found", apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "s"), true},
		{"another failure", errors.New("connection refused"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := error(nil)
			if tc.kept {
				want = tc.err
			}
			if got := IgnoreConflict(tc.err); got != want {
				t.Errorf("IgnoreConflict(%v) = %v, want %v", tc.err, got, want)
			}
		})
	}
}
