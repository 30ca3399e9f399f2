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

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// The Events of a pass say what its status write says: a pass whose
// status patch fails (the API server unavailable for a moment) records
// none (the pass that follows, from a fresh read, finds the same changes
// and records them once), and a pass whose patch succeeds records each
// change.
func TestWriteRecordsEventsOnlyAfterTheStatusIsWritten(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, clientgoscheme.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	b := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup", Generation: 1},
		Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
	}
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
