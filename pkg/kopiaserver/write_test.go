package kopiaserver

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/optimistic"
)

// The Events of a pass say what its status write says: a pass whose
// status patch fails (the API server unavailable for a moment) records
// none (the pass that follows, from a fresh read, finds the same changes
// and records them once), and a pass whose patch succeeds records each
// change.
func TestWriteRecordsEventsOnlyAfterTheStatusIsWritten(t *testing.T) {
	scheme, b := writeFixture(t)
	failures := 1
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(b).WithStatusSubresource(b).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if failures > 0 {
				failures--
				return apierrors.NewServiceUnavailable("etcd leader changed")
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		}}).Build()
	recorder := record.NewFakeRecorder(100)
	r := &Reconciler{Client: c, APIReader: c, Scheme: scheme, Recorder: recorder}

	pass := func() error {
		read := &v1alpha1.BackupStorageLocationServer{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(b), read); err != nil {
			t.Fatal(err)
		}
		obs := observations{BSLS: read.DeepCopy(), Now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
			CertificateProblem: &problem{ReasonTLSSecretNotFound, "no Secret"}}
		return writePass(r, read, obs)
	}

	if err := pass(); !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("first pass: error %v, want the status patch's", err)
	}
	if n := len(recorder.Events); n != 0 {
		t.Fatalf("the pass whose status patch failed recorded %d Events, e.g. %q: the next pass records them again", n, <-recorder.Events)
	}
	if err := pass(); err != nil {
		t.Fatalf("second pass: %v", err)
	}
	if n := len(recorder.Events); n != 8 {
		t.Errorf("the pass whose status patch succeeded recorded %d Events, want one per condition (8)", n)
	}
}

// writePass decides and writes one pass over obs.
func writePass(r *Reconciler, b *v1alpha1.BackupStorageLocationServer, obs observations) error {
	want, err := desire(obs)
	if err != nil {
		return err
	}
	_, err = r.write(context.Background(), b, obs, want)
	return err
}

// A pass that read its BSLS from a cache that had not caught up with the
// API server derives a status from an old one: what the server pod's
// verification found before, where it now finds something else. Its
// status write fails with a conflict rather than write over the newer
// status; a pass whose only newer version is its own write (prepare's
// finalizer) writes.
func TestWriteDoesNotWriteOverANewerStatus(t *testing.T) {
	scheme, b := writeFixture(t)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(b).WithStatusSubresource(b).Build()
	r := &Reconciler{Client: c, APIReader: c, Scheme: scheme, Recorder: record.NewFakeRecorder(100)}
	ctx := context.Background()
	key := client.ObjectKeyFromObject(b)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pass := func(read *v1alpha1.BackupStorageLocationServer, prepared func(*v1alpha1.BackupStorageLocationServer)) error {
		obs := observations{BSLS: read.DeepCopy(), Now: now, CertificateProblem: &problem{ReasonTLSSecretNotFound, "no Secret"}}
		if prepared != nil {
			prepared(read)
		}
		want, err := desire(obs)
		if err != nil {
			return err
		}
		_, err = r.write(ctx, read, obs, want)
		return err
	}

	stale := &v1alpha1.BackupStorageLocationServer{}
	if err := c.Get(ctx, key, stale); err != nil {
		t.Fatal(err)
	}
	newer := stale.DeepCopy()
	newer.Status.Integrity = &v1alpha1.IntegrityStatus{Contents: 912}
	if err := c.Status().Update(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if err := pass(stale, nil); !apierrors.IsConflict(err) {
		t.Fatalf("a pass from the old version: error %v, want a conflict", err)
	}
	got := &v1alpha1.BackupStorageLocationServer{}
	if err := c.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Integrity == nil || got.Status.Integrity.Contents != 912 {
		t.Fatalf("the newer status was written over: integrity %+v", got.Status.Integrity)
	}

	// Read again; prepare adds a finalizer (locked), which makes the
	// version the pass read older than the API server's.
	fresh := got.DeepCopy()
	if err := pass(fresh, func(b *v1alpha1.BackupStorageLocationServer) {
		if err := optimistic.Patch(ctx, c, b, func() { controllerutil.AddFinalizer(b, FinalizerCAGuard) }); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Fatalf("a pass whose own finalizer patch made the newer version: %v", err)
	}
	if err := c.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Endpoint == "" || !controllerutil.ContainsFinalizer(got, FinalizerCAGuard) {
		t.Errorf("after a fresh pass: endpoint %q, finalizers %q; want the pass's status and its finalizer", got.Status.Endpoint, got.Finalizers)
	}
}

// writeFixture is the scheme of a BSLS reconciler and a BSLS for it.
func writeFixture(t *testing.T) (*runtime.Scheme, *v1alpha1.BackupStorageLocationServer) {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, clientgoscheme.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return scheme, &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup", Generation: 1},
		Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
	}
}
