package credentials

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// serverKey is the BSLS of the rerender tests.
var serverKey = types.NamespacedName{Namespace: "storage", Name: "main"}

// rendered is a test's view of a bootstrap: where, trusting what, with
// which paths and placement.
type rendered struct {
	endpoint string
	ca       []byte
	paths    []string
	mode     string
	userPart []byte
}

const (
	oldURL      = "https://main.storage.svc:51515"
	newURL      = "https://kopia.example.com:443"
	rrPassword  = "0123456789abcdef0123"
	rrVMUID     = "vm-uid"
	rrOwnerPart = "#cloud-config\nruncmd: [echo owner]\n"
)

func testCA(t *testing.T, name string) []byte {
	t.Helper()
	ca, err := pki.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return pki.EncodeCert(ca.Cert)
}

func payloadOf(t *testing.T, r rendered) map[string][]byte {
	t.Helper()
	p, err := cloudinit.Payload(cloudinit.Bootstrap{
		ServerURL: r.endpoint, CA: r.ca, Username: "web@team-a", Password: rrPassword, Generation: 3, Paths: r.paths,
	}, cloudinit.Placement{Mode: r.mode, UserPart: r.userPart})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// injectedSecret is web's Secret as the webhook wrote it for r, adopted by
// its VM, hashed by the Hasher.
func injectedSecret(t *testing.T, r rendered) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-guestbackup", Namespace: "team-a",
			Labels:          vmsecret.Labels("web", serverKey),
			OwnerReferences: []metav1.OwnerReference{vmsecret.OwnerReference("web", rrVMUID)},
			Annotations:     map[string]string{vmsecret.AnnotationIssuedAt: "2026-03-01T11:00:00Z"},
		},
		Data: payloadOf(t, r),
	}
	s.Data[vmsecret.KeyUsername] = []byte("web@team-a")
	s.Data[vmsecret.KeyPassword] = []byte(rrPassword)
	s.Data[vmsecret.KeyGeneration] = []byte("3")
	s.Data[vmsecret.KeyPasswordHash] = []byte("hash")
	s.Data[vmsecret.KeyPasswordHashGeneration] = []byte("3")
	vmsecret.SetRendered(s, r.endpoint, r.ca, injectedAt)
	return s
}

// injectedAt is when the webhook rendered web's Secret, and rerenderedAt
// when the controller renders it again.
var (
	injectedAt   = time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)
	rerenderedAt = time.Date(2026, 3, 2, 8, 30, 0, 0, time.UTC)
)

// injectedVM is web's metadata as the webhook admitted it.
func injectedVM(t *testing.T, r rendered) *metav1.PartialObjectMetadata {
	t.Helper()
	st := v1alpha1.InjectionStatus{Mode: r.mode, Server: serverKey.String(), Secret: "web-guestbackup", User: "web@team-a", Generation: 3, Volume: "guestbackup-cloudinit"}
	if r.userPart != nil {
		st.MergedFrom, st.Volume = "userData", "cloudinit"
	}
	status, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: "web", Namespace: "team-a", UID: rrVMUID,
		Annotations: map[string]string{
			v1alpha1.AnnotationServer: serverKey.String(), v1alpha1.AnnotationStatus: string(status),
			v1alpha1.AnnotationPaths: strings.Join(r.paths, ","),
		},
	}}
}

func publishing(endpoint string, ca []byte) *v1alpha1.BackupStorageLocationServer {
	return &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Namespace: serverKey.Namespace, Name: serverKey.Name},
		Status:     v1alpha1.BackupStorageLocationServerStatus{Endpoint: endpoint, TLSCA: string(ca)},
	}
}

func TestRerender(t *testing.T) {
	oldCA, newCA := testCA(t, "old"), testCA(t, "new")
	was := rendered{endpoint: oldURL, ca: oldCA, paths: []string{"/srv"}, mode: v1alpha1.ModeCloudInit}
	with := func(r rendered, f func(*rendered)) rendered { f(&r); return r }

	for _, tt := range []struct {
		name   string
		was    rendered // what the Secret was rendered with
		secret func(*corev1.Secret)
		vm     func(*metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata
		bsls   *v1alpha1.BackupStorageLocationServer
		// want is what the Secret must be rendered for; nil: left as it is.
		want *rendered
		// event says what the Event must name; "": no Event.
		event string
	}{
		{name: "new CA", was: was, bsls: publishing(oldURL, newCA),
			want: ptrTo(with(was, func(r *rendered) { r.ca = newCA })), event: "new CA (SHA-256 " + vmsecret.CASum(newCA) + ")"},
		{name: "new URL", was: was, bsls: publishing(newURL, oldCA),
			want: ptrTo(with(was, func(r *rendered) { r.endpoint = newURL })), event: "new URL " + newURL},
		{name: "both", was: was, bsls: publishing(newURL, newCA),
			want: ptrTo(with(was, func(r *rendered) { r.endpoint, r.ca = newURL, newCA })), event: "URL " + newURL + " and CA"},
		{name: "disk mode stays disk mode", was: with(was, func(r *rendered) { r.mode = v1alpha1.ModeDisk }), bsls: publishing(oldURL, newCA),
			want: ptrTo(with(was, func(r *rendered) { r.mode, r.ca = v1alpha1.ModeDisk, newCA })), event: "disk mode"},
		{name: "the owner's merged part is kept", was: with(was, func(r *rendered) { r.userPart = []byte(rrOwnerPart) }), bsls: publishing(oldURL, newCA),
			want: ptrTo(with(was, func(r *rendered) { r.userPart, r.ca = []byte(rrOwnerPart), newCA })), event: "new CA"},
		{name: "paths as the VM's annotations say", was: was, bsls: publishing(oldURL, newCA),
			vm: func(vm *metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata {
				vm.Annotations[v1alpha1.AnnotationPaths] = "/home,/etc"
				return vm
			},
			want: ptrTo(with(was, func(r *rendered) { r.ca, r.paths = newCA, []string{"/home", "/etc"} })), event: "new CA"},
		{name: "a Secret without a record, already right, is only recorded", was: was, bsls: publishing(oldURL, oldCA),
			secret: func(s *corev1.Secret) {
				delete(s.Annotations, vmsecret.AnnotationRenderedEndpoint)
				delete(s.Annotations, vmsecret.AnnotationRenderedCA)
				delete(s.Annotations, vmsecret.AnnotationRenderedCAAt)
			},
			want: &was},
		{name: "a Secret without a record, rendered for another server", was: was, bsls: publishing(newURL, oldCA),
			secret: func(s *corev1.Secret) {
				delete(s.Annotations, vmsecret.AnnotationRenderedEndpoint)
				delete(s.Annotations, vmsecret.AnnotationRenderedCA)
				delete(s.Annotations, vmsecret.AnnotationRenderedCAAt)
			},
			want: ptrTo(with(was, func(r *rendered) { r.endpoint = newURL })), event: "did not record being rendered with"},

		{name: "unchanged", was: was, bsls: publishing(oldURL, oldCA)},
		{name: "server deleted", was: was},
		{name: "server publishes no endpoint", was: was, bsls: publishing("", newCA)},
		{name: "server publishes no CA", was: was, bsls: publishing(newURL, nil)},
		{name: "server publishes a CA that is no PEM", was: was, bsls: publishing(oldURL, []byte("garbage"))},
		{name: "another server of the same name", was: was, bsls: func() *v1alpha1.BackupStorageLocationServer {
			b := publishing(newURL, newCA)
			b.Namespace = "other"
			return b
		}()},
		{name: "not guestbackup's", was: was, bsls: publishing(newURL, newCA),
			secret: func(s *corev1.Secret) { delete(s.Labels, vmsecret.LabelManagedBy) }},
		{name: "not adopted yet", was: was, bsls: publishing(newURL, newCA),
			secret: func(s *corev1.Secret) { s.OwnerReferences = nil }},
		{name: "controlled by a previous VM of that name", was: was, bsls: publishing(newURL, newCA),
			secret: func(s *corev1.Secret) {
				s.OwnerReferences = []metav1.OwnerReference{vmsecret.OwnerReference("web", "old-uid")}
			}},
		{name: "Secret being deleted", was: was, bsls: publishing(newURL, newCA),
			secret: func(s *corev1.Secret) { s.DeletionTimestamp = &metav1.Time{Time: now} }},
		{name: "no VM", was: was, bsls: publishing(newURL, newCA),
			vm: func(*metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata { return nil }},
		{name: "VM being deleted", was: was, bsls: publishing(newURL, newCA),
			vm: func(vm *metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata {
				vm.DeletionTimestamp = &metav1.Time{Time: now}
				return vm
			}},
		{name: "VM opted out", was: was, bsls: publishing(newURL, newCA),
			vm: func(vm *metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata {
				delete(vm.Annotations, v1alpha1.AnnotationServer)
				return vm
			}},
		{name: "VM's status is of another generation (an admission in flight)", was: was, bsls: publishing(newURL, newCA),
			secret: func(s *corev1.Secret) { s.Data[vmsecret.KeyGeneration] = []byte("4") }},
		{name: "VM's status says disk, the Secret holds user-data", was: was, bsls: publishing(newURL, newCA),
			vm: func(vm *metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata {
				vm.Annotations[v1alpha1.AnnotationStatus] = strings.Replace(vm.Annotations[v1alpha1.AnnotationStatus], `"cloud-init"`, `"disk"`, 1)
				return vm
			}},
		{name: "merged, but the owner's part is gone", was: with(was, func(r *rendered) { r.userPart = []byte(rrOwnerPart) }), bsls: publishing(newURL, newCA),
			secret: func(s *corev1.Secret) { s.Data[vmsecret.KeyUserData] = []byte("#cloud-config\n") }},
		{name: "VM's schedule is not one", was: was, bsls: publishing(newURL, newCA),
			vm: func(vm *metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata {
				vm.Annotations[v1alpha1.AnnotationSchedule] = "daily; rm -rf /"
				return vm
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			secret := injectedSecret(t, tt.was)
			if tt.secret != nil {
				tt.secret(secret)
			}
			vm := injectedVM(t, tt.was)
			if tt.vm != nil {
				vm = tt.vm(vm)
			}
			before := secret.DeepCopy()
			got := rerender(vm, secret, tt.bsls, rerenderedAt)
			if !equalSecrets(before, secret) {
				t.Fatal("rerender changed its input Secret")
			}
			if tt.want == nil {
				if got.secret != nil {
					t.Fatalf("rendered again; want the Secret left as it is")
				}
				if got.why == "" {
					t.Error("no why for leaving it")
				}
				return
			}
			if got.secret == nil {
				t.Fatalf("left as it is (%s); want it rendered again", got.why)
			}
			// Everything but the payload and the record stays.
			want := before.DeepCopy()
			maps.DeleteFunc(want.Data, func(k string, _ []byte) bool { return vmsecret.IsPayloadKey(k) })
			maps.Copy(want.Data, payloadOf(t, *tt.want))
			vmsecret.SetRendered(want, tt.want.endpoint, tt.want.ca, rerenderedAt)
			if !equalSecrets(want, got.secret) {
				t.Errorf("rendered Secret differs:\n got %v\nwant %v", keysOf(got.secret), keysOf(want))
			}
			// When the guest's trust changes is what a CA rotation waits on.
			wantAt := injectedAt
			if _, recorded := vmsecret.RenderedCAAt(before); string(tt.want.ca) != string(tt.was.ca) || !recorded {
				// A Secret that does not say since when counts as
				// rendered now: a guest started before may not trust it.
				wantAt = rerenderedAt
			}
			if at, ok := vmsecret.RenderedCAAt(got.secret); !ok || !at.Equal(wantAt) {
				t.Errorf("rendered with its CA since %v (%v); want %v", at, ok, wantAt)
			}
			if tt.want.userPart != nil {
				part, err := cloudinit.UserPart(got.secret.Data[vmsecret.KeyUserData])
				if err != nil || string(part) != string(tt.want.userPart) {
					t.Errorf("owner's part = %q, %v; want %q byte for byte", part, err, tt.want.userPart)
				}
			}
			switch {
			case tt.event == "" && got.event != "":
				t.Errorf("Event %q; want none", got.event)
			case tt.event != "" && !strings.Contains(got.event, tt.event):
				t.Errorf("Event %q; want it to say %q", got.event, tt.event)
			case tt.event != "" && !strings.Contains(got.event, "next start"):
				t.Errorf("Event %q does not say when the guest gets it", got.event)
			case strings.Contains(got.event, rrPassword):
				t.Errorf("Event %q carries the password", got.event)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

func equalSecrets(a, b *corev1.Secret) bool {
	return maps.EqualFunc(a.Data, b.Data, func(x, y []byte) bool { return string(x) == string(y) }) &&
		maps.Equal(a.Annotations, b.Annotations) && maps.Equal(a.Labels, b.Labels) &&
		len(a.OwnerReferences) == len(b.OwnerReferences)
}

func keysOf(s *corev1.Secret) []string {
	var keys []string
	for k, v := range s.Data {
		keys = append(keys, k+"="+vmsecret.CASum(v)[:8])
	}
	for k, v := range s.Annotations {
		keys = append(keys, k+"="+v)
	}
	return keys
}
