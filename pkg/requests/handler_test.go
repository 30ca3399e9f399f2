package requests

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// The Handler's edges, fast, with a fake API server; the suite proves the
// same against a real one.

// reads counts the Gets a fake API server receives, and fails them with
// fail when it is set.
type reads struct {
	n    int
	fail error
}

func (r *reads) reader(t *testing.T, objs ...client.Object) client.Reader {
	t.Helper()
	scheme := k8sruntime.NewScheme()
	if err := kubevirtv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			r.n++
			if r.fail != nil {
				return r.fail
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
}

func webVM() *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a",
		Annotations: map[string]string{v1alpha1.AnnotationServer: "backup/main", v1alpha1.AnnotationPaths: "/etc"}}}
}

func request(t *testing.T, op admissionv1.Operation, kind string, obj any) admission.Request {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "test", Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Kind: kind},
		Namespace: "team-a", Operation: op, Object: k8sruntime.RawExtension{Raw: raw},
		UserInfo: authenticationv1.UserInfo{Username: "alice", Groups: []string{"team-a-devs"}},
	}}
}

func TestHandlerStampsTheRequesterInOneOperation(t *testing.T) {
	var r reads
	h := &Handler{Reader: r.reader(t, webVM()), Clock: clocktesting.NewFakePassiveClock(now)}
	s := &v1alpha1.GuestSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "now", Namespace: "team-a"},
		Spec: v1alpha1.GuestSnapshotSpec{VM: "web", Requester: &v1alpha1.Requester{Username: "system:admin", Groups: []string{"system:masters"}}}}

	resp := h.Handle(context.Background(), request(t, admissionv1.Create, KindGuestSnapshot, s))
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	want := []jsonpatch.JsonPatchOperation{{Operation: "add", Path: "/spec/requester", Value: v1alpha1.Requester{Username: "alice", Groups: []string{"team-a-devs"}}}}
	if !reflect.DeepEqual(resp.Patches, want) {
		t.Errorf("patch %+v, want %+v: the forged requester replaced, nothing else touched", resp.Patches, want)
	}
	if r.n != 1 {
		t.Errorf("%d reads of the API server, want 1 (the VM)", r.n)
	}
}

func TestHandlerDeniesWithWhatToFix(t *testing.T) {
	var r reads
	h := &Handler{Reader: r.reader(t, webVM()), Clock: clocktesting.NewFakePassiveClock(now)}
	g := &v1alpha1.GuestRestore{ObjectMeta: metav1.ObjectMeta{GenerateName: "nginx-", Namespace: "team-a"},
		Spec: v1alpha1.GuestRestoreSpec{VM: "web", SourceVM: "old", Paths: []string{"/etc/nginx"}}}

	resp := h.Handle(context.Background(), request(t, admissionv1.Create, KindGuestRestore, g))
	want := "guestbackup cannot admit GuestRestore nginx-*: spec.sourceVM: VirtualMachine web may not read the snapshots of old"
	if resp.Allowed || resp.Result.Code != http.StatusForbidden || !strings.HasPrefix(resp.Result.Message, want) {
		t.Errorf("allowed %t, %d %q; want denied: %q", resp.Allowed, resp.Result.Code, resp.Result.Message, want)
	}
	if len(resp.Patches) != 0 {
		t.Errorf("a denial patches: %v", resp.Patches)
	}
}

func TestHandlerFailsClosedWhenItCannotReadTheVM(t *testing.T) {
	r := reads{fail: errors.New("connection refused")}
	h := &Handler{Reader: r.reader(t), Clock: clocktesting.NewFakePassiveClock(now)}
	resp := h.Handle(context.Background(), request(t, admissionv1.Create, KindGuestSnapshot,
		&v1alpha1.GuestSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "now"}, Spec: v1alpha1.GuestSnapshotSpec{VM: "web"}}))
	if resp.Allowed || resp.Result.Code != http.StatusInternalServerError || !strings.Contains(resp.Result.Message, "read VirtualMachine team-a/web: connection refused") {
		t.Errorf("allowed %t, %d %q; want an error naming the VM", resp.Allowed, resp.Result.Code, resp.Result.Message)
	}
}

func TestHandlerLetsEverythingButCreationPass(t *testing.T) {
	var r reads
	h := &Handler{Reader: r.reader(t), Clock: clocktesting.NewFakePassiveClock(now)}
	for _, op := range []admissionv1.Operation{admissionv1.Update, admissionv1.Delete, admissionv1.Connect} {
		resp := h.Handle(context.Background(), request(t, op, KindGuestSnapshot, &v1alpha1.GuestSnapshot{}))
		if !resp.Allowed || len(resp.Patches) != 0 {
			t.Errorf("%s: allowed %t, patches %v; want allowed untouched (CEL keeps the spec)", op, resp.Allowed, resp.Patches)
		}
	}
	if r.n != 0 {
		t.Errorf("%d reads for requests it has nothing to decide on", r.n)
	}
}
