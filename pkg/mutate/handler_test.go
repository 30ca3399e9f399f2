package mutate

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The Handler's edges, fast: its cache and the API server are fake clients
// (controller-runtime's, with interceptors for what a real one does at the
// worst moment). The envtest suite (test/kubevirt) proves the same against
// a real API server.

func handlerScheme(t *testing.T) *k8sruntime.Scheme {
	t.Helper()
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// apiObjects are what a cluster holds for a VM of team-a to use backup/main.
func apiObjects() []client.Object {
	bsls := readyServer().BSLS.DeepCopy()
	bsls.Spec.Access.NamespaceSelector = &metav1.LabelSelector{}
	return []client.Object{bsls, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}}
}

// writes counts the Secret writes a client receives, and fails them with
// fail when it is set.
type writes struct {
	n    int
	fail error
}

func (w *writes) funcs() interceptor.Funcs {
	write := func() error {
		w.n++
		return w.fail
	}
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := write(); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := write(); err != nil {
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if err := write(); err != nil {
				return err
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}
}

func admissionRequest(t *testing.T, op admissionv1.Operation, obj []byte) admission.Request {
	t.Helper()
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "test", Kind: metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"},
		Namespace: "team-a", Operation: op, Object: k8sruntime.RawExtension{Raw: obj},
	}}
}

func TestHandlerDecidesWritesOnTheAPIServersState(t *testing.T) {
	scheme := handlerScheme(t)
	foreign := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "web-guestbackup", Namespace: "team-a", Labels: map[string]string{"app": "web"}},
		Data:       map[string][]byte{"token": []byte("someone's data")},
	}
	// The cache holds guestbackup's Secrets only (CacheOptions): it does
	// not see the foreign Secret the API server has.
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(apiObjects()...).Build()
	var w writes
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(apiObjects(), foreign)...).WithInterceptorFuncs(w.funcs()).Build()
	h := &Handler{Cache: cache, Reader: api, Writer: api}

	resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, readVM(t, "no-cloud-init")))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "Secret team-a/web-guestbackup already exists and is not guestbackup's credential Secret for VirtualMachine web") {
		t.Fatalf("allowed %t: %q; want the foreign Secret to deny the VM", resp.Allowed, resp.Result.Message)
	}
	if w.n != 0 {
		t.Errorf("%d writes to the API server, want none", w.n)
	}
	got := &corev1.Secret{}
	if err := api.Get(context.Background(), client.ObjectKeyFromObject(foreign), got); err != nil || string(got.Data["token"]) != "someone's data" || len(got.Data) != 1 {
		t.Errorf("the foreign Secret changed: %v %v", got.Data, err)
	}
}

func TestHandlerFailsTheAdmissionOnAWriteConflict(t *testing.T) {
	scheme := handlerScheme(t)
	original := readVM(t, "no-cloud-init")
	first := decide(t, original, nil, &passwords{})
	stored := first.Secret.DeepCopy()
	objs := append(apiObjects(), stored)
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	w := writes{fail: apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, "web-guestbackup", nil)}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(w.funcs()).Build()
	h := &Handler{Cache: cache, Reader: api, Writer: api}

	// New paths: the Secret is rewritten, and the write loses a race.
	mutated := withAnnotation(t, apply(t, original, first), v1alpha1.AnnotationPaths, "/var/lib/app")
	resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Update, mutated))
	if resp.Allowed || resp.Result.Code != http.StatusInternalServerError || len(resp.Patches) != 0 {
		t.Fatalf("allowed %t, code %d, %d patches: want the admission failed (the client retries and it is decided again)", resp.Allowed, resp.Result.Code, len(resp.Patches))
	}
	if w.n != 1 {
		t.Errorf("%d writes, want the one that conflicted", w.n)
	}
}

// TestHandlerCountsAnOutcomeOnceItsSecretIsWritten: an admission whose
// Secret cannot be written issued nothing; it counts as an error, never as
// the outcome it was decided to have.
func TestHandlerCountsAnOutcomeOnceItsSecretIsWritten(t *testing.T) {
	scheme := handlerScheme(t)
	w := writes{fail: apierrors.NewServiceUnavailable("etcd is away")}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(apiObjects()...).WithInterceptorFuncs(w.funcs()).Build()
	h := &Handler{Reader: api, Writer: api}
	issued, failed := admissionsTotal.WithLabelValues(OutcomeIssued), admissionsTotal.WithLabelValues(outcomeError)
	issuedBefore, failedBefore := testutil.ToFloat64(issued), testutil.ToFloat64(failed)

	resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, readVM(t, "no-cloud-init")))
	if resp.Allowed || resp.Result.Code != http.StatusInternalServerError || w.n != 1 {
		t.Fatalf("allowed %t, code %d, %d writes: want the admission failed on its one write", resp.Allowed, resp.Result.Code, w.n)
	}
	if got := testutil.ToFloat64(issued) - issuedBefore; got != 0 {
		t.Errorf("%v admissions counted as %s, want none: no credentials were issued", got, OutcomeIssued)
	}
	if got := testutil.ToFloat64(failed) - failedBefore; got != 1 {
		t.Errorf("%v admissions counted as error, want 1", got)
	}

	w.fail = nil
	resp = h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, readVM(t, "no-cloud-init")))
	if !resp.Allowed || w.n != 2 {
		t.Fatalf("allowed %t (%s), %d writes: want the retry admitted and its Secret written", resp.Allowed, resp.Result.Message, w.n)
	}
	if got := testutil.ToFloat64(issued) - issuedBefore; got != 1 {
		t.Errorf("%v admissions counted as %s, want the retry's 1", got, OutcomeIssued)
	}
}

func TestHandlerRefusals(t *testing.T) {
	scheme := handlerScheme(t)
	generated := func() []byte {
		var m map[string]any
		_ = json.Unmarshal(readVM(t, "no-cloud-init"), &m)
		meta := m["metadata"].(map[string]any)
		delete(meta, "name")
		meta["generateName"] = "web-"
		out, _ := json.Marshal(m)
		return out
	}()
	long := func() []byte {
		var m map[string]any
		_ = json.Unmarshal(readVM(t, "no-cloud-init"), &m)
		m["metadata"].(map[string]any)["name"] = strings.Repeat("v", 64)
		out, _ := json.Marshal(m)
		return out
	}()
	for _, tc := range []struct {
		name, want string
		obj        []byte
	}{
		{"a VM named by generateName", "guestbackup needs the VM's metadata.name to issue its identity", generated},
		{"a VM whose name cannot label its Secret", "its name (64 characters) cannot label its credential Secret", long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w writes
			cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(apiObjects()...).Build()
			api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(apiObjects()...).WithInterceptorFuncs(w.funcs()).Build()
			h := &Handler{Cache: cache, Reader: api, Writer: api}
			resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, tc.obj))
			if resp.Allowed || resp.Result.Code != http.StatusForbidden || !strings.Contains(resp.Result.Message, tc.want) {
				t.Errorf("allowed %t, code %d: %q; want a denial containing %q", resp.Allowed, resp.Result.Code, resp.Result.Message, tc.want)
			}
			if w.n != 0 {
				t.Errorf("%d writes, want none", w.n)
			}
		})
	}
}

func TestHandlerDryRunWritesNothing(t *testing.T) {
	var w writes
	cache := fake.NewClientBuilder().WithScheme(handlerScheme(t)).WithObjects(apiObjects()...).Build()
	api := fake.NewClientBuilder().WithScheme(handlerScheme(t)).WithObjects(apiObjects()...).WithInterceptorFuncs(w.funcs()).Build()
	h := &Handler{Cache: cache, Reader: api, Writer: api}
	req := admissionRequest(t, admissionv1.Create, readVM(t, "no-cloud-init"))
	req.DryRun = ptr.To(true)
	resp := h.Handle(context.Background(), req)
	if !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("allowed %t with %d patches: want the injection, as a real admission", resp.Allowed, len(resp.Patches))
	}
	if w.n != 0 {
		t.Errorf("%d writes on a dry run, want none", w.n)
	}
}

func updateRequest(t *testing.T, obj, old []byte) admission.Request {
	t.Helper()
	req := admissionRequest(t, admissionv1.Update, obj)
	req.OldObject = k8sruntime.RawExtension{Raw: old}
	return req
}

// TestHandlerDecidesAWriteAgainOnTheLiveSecret: the cache still holds the
// Secret before a rotation the webhook itself wrote a moment ago. A new
// paths annotation decided on it would write the old password back; the
// write is decided on the API server's Secret.
func TestHandlerDecidesAWriteAgainOnTheLiveSecret(t *testing.T) {
	scheme := handlerScheme(t)
	original := readVM(t, "no-cloud-init")
	pw := &passwords{}
	first := decide(t, original, nil, pw)
	stored := apply(t, original, first)
	rotating := withAnnotation(t, stored, v1alpha1.AnnotationRotate, "1")
	rotation := decide(t, rotating, first.Secret, pw)
	rotated := apply(t, rotating, rotation)

	stale := first.Secret.DeepCopy()
	stale.ResourceVersion = ""
	live := rotation.Secret.DeepCopy()
	live.ResourceVersion = ""
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(apiObjects(), stale)...).Build()
	var w writes
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(apiObjects(), live)...).WithInterceptorFuncs(w.funcs()).Build()
	h := &Handler{Cache: cache, Reader: api, Writer: api}

	resp := h.Handle(context.Background(), updateRequest(t, withAnnotation(t, rotated, v1alpha1.AnnotationPaths, "/var/lib/app"), rotated))
	if !resp.Allowed || w.n != 1 {
		t.Fatalf("allowed %t (%s), %d writes; want the new paths written once", resp.Allowed, resp.Result.Message, w.n)
	}
	got := &corev1.Secret{}
	if err := api.Get(context.Background(), client.ObjectKeyFromObject(live), got); err != nil {
		t.Fatal(err)
	}
	if string(got.Data[v1alpha1.SecretKeyGeneration]) != "2" || string(got.Data[v1alpha1.SecretKeyPassword]) != string(live.Data[v1alpha1.SecretKeyPassword]) {
		t.Errorf("generation %s: the stale cache's credentials were written back over the rotation", got.Data[v1alpha1.SecretKeyGeneration])
	}
}

// TestHandlerReadsTheStoredVM: an update that removes the status
// annotation is decided on the VM as stored (the request's oldObject).
func TestHandlerReadsTheStoredVM(t *testing.T) {
	scheme := handlerScheme(t)
	original := readVM(t, "inline-cloud-config")
	first := decide(t, original, nil, &passwords{})
	stored := apply(t, original, first)
	secret := first.Secret.DeepCopy()
	var w writes
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(apiObjects(), secret.DeepCopy())...).Build()
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(apiObjects(), secret.DeepCopy())...).WithInterceptorFuncs(w.funcs()).Build()
	h := &Handler{Cache: cache, Reader: api, Writer: api}

	removed := withoutAnnotations(t, stored, v1alpha1.AnnotationStatus)
	resp := h.Handle(context.Background(), updateRequest(t, removed, stored))
	if !resp.Allowed || w.n != 0 || len(resp.Patches) != 1 || resp.Patches[0].Path != "/metadata/annotations/guestbackup.io~1status" {
		t.Errorf("allowed %t (%s), %d writes, patches %+v; want only the status put back", resp.Allowed, resp.Result.Message, w.n, resp.Patches)
	}
}

// TestHandlerReadsACopysSource: a copy's source Secret is read for the
// owner's user-data, and never written; a failure to read it fails the
// admission rather than deciding without it.
func TestHandlerReadsACopysSource(t *testing.T) {
	scheme := handlerScheme(t)
	stored, source := injected(t, "inline-cloud-config")
	clone := withField(t, stored, "copy", "metadata", "name")
	before := source.DeepCopy()

	var w writes
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(apiObjects(), source.DeepCopy())...).Build()
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(apiObjects(), source.DeepCopy())...).WithInterceptorFuncs(w.funcs()).Build()
	h := &Handler{Cache: cache, Reader: api, Writer: api}
	resp := h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, clone))
	if !resp.Allowed || w.n != 1 {
		t.Fatalf("allowed %t (%s), %d writes; want the copy's own Secret written", resp.Allowed, resp.Result.Message, w.n)
	}
	got := &corev1.Secret{}
	if err := api.Get(context.Background(), client.ObjectKeyFromObject(source), got); err != nil || string(got.Data[v1alpha1.SecretKeyPassword]) != string(before.Data[v1alpha1.SecretKeyPassword]) {
		t.Errorf("the source's Secret changed (%v)", err)
	}
	if err := api.Get(context.Background(), client.ObjectKey{Namespace: "team-a", Name: "copy-guestbackup"}, got); err != nil || vmsecret.VM(got) != "copy" {
		t.Errorf("the copy's Secret: %v %v", got.Labels, err)
	}

	failing := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(apiObjects(), source.DeepCopy())...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if key.Name == source.Name {
				return apierrors.NewServiceUnavailable("etcd is away")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	h = &Handler{Reader: failing, Writer: failing}
	resp = h.Handle(context.Background(), admissionRequest(t, admissionv1.Create, clone))
	if resp.Allowed || resp.Result.Code != http.StatusInternalServerError {
		t.Errorf("allowed %t, code %d: want the admission failed (retried), not decided without the source", resp.Allowed, resp.Result.Code)
	}
}
