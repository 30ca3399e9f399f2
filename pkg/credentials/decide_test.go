package credentials

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// now is the fixed clock of the decision tests.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var defaults = timing{orphanGrace: 10 * time.Minute, settle: 30 * time.Second}

// secretOpt adjusts the credential Secret of a decision test.
type secretOpt func(*corev1.Secret)

// testSecret is web's credential Secret for storage/main as the webhook
// writes it, created and last written an hour before now.
func testSecret(opts ...secretOpt) *corev1.Secret {
	hourAgo := metav1.NewTime(now.Add(-time.Hour))
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-guestbackup", Namespace: "team-a", UID: "secret-uid",
			CreationTimestamp: hourAgo,
			Labels: map[string]string{
				v1alpha1.LabelManagedBy:       v1alpha1.ManagedByValue,
				v1alpha1.LabelVM:              "web",
				v1alpha1.LabelServerNamespace: "storage",
				v1alpha1.LabelServerName:      "main",
			},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "webhook", Operation: metav1.ManagedFieldsOperationUpdate, Time: &hourAgo}},
		},
		Data: map[string][]byte{
			v1alpha1.SecretKeyUsername:   []byte("web@team-a"),
			v1alpha1.SecretKeyPassword:   []byte("not-a-real-password"),
			v1alpha1.SecretKeyGeneration: []byte("1"),
			// Hashed, as the Hasher leaves it; the value is never checked.
			v1alpha1.SecretKeyPasswordHash:           []byte(identity.Hash{Version: identity.Scrypt, Value: make([]byte, 64)}.String()),
			v1alpha1.SecretKeyPasswordHashGeneration: []byte("1"),
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// ownedByVM is the Secret as the VM reconciler adopts it for VM web of uid.
func ownedByVM(uid types.UID) secretOpt {
	return func(s *corev1.Secret) {
		s.OwnerReferences = append(s.OwnerReferences, vmsecret.OwnerReference("web", uid))
	}
}

// ownerOnly is the Secret as releases before the identity fix adopted it:
// the VM an owner, not the controller.
func ownerOnly(uid types.UID) secretOpt {
	return func(s *corev1.Secret) {
		s.OwnerReferences = append(s.OwnerReferences, metav1.OwnerReference{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "web", UID: uid, Controller: ptr.To(false)})
	}
}

func created(ago time.Duration) secretOpt {
	return func(s *corev1.Secret) {
		t := metav1.NewTime(now.Add(-ago))
		s.CreationTimestamp = t
		s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "webhook", Time: &t}}
	}
}

func writtenBy(manager string, ago time.Duration) secretOpt {
	return func(s *corev1.Secret) {
		t := metav1.NewTime(now.Add(-ago))
		s.ManagedFields = append(s.ManagedFields, metav1.ManagedFieldsEntry{Manager: manager, Time: &t})
	}
}

// rotated is the Secret after the webhook issued generation 2, before the
// Hasher hashed its password.
func rotated(s *corev1.Secret) {
	s.Data[v1alpha1.SecretKeyGeneration] = []byte("2")
}

func withoutLabel(key string) secretOpt {
	return func(s *corev1.Secret) { delete(s.Labels, key) }
}

// testVM is the VM web, stored with uid, opted in to server ("" for none).
func testVM(uid types.UID, server string) *metav1.PartialObjectMetadata {
	vm := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a", UID: uid}}
	vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	if server != "" {
		vm.Annotations = map[string]string{v1alpha1.AnnotationServer: server}
	}
	return vm
}

func deleting(vm *metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata {
	vm.DeletionTimestamp = &metav1.Time{Time: now.Add(-time.Second)}
	vm.Finalizers = []string{"kubevirt.io/virtualMachineControllerFinalize"}
	return vm
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vm      *metav1.PartialObjectMetadata
		secret  *corev1.Secret
		want    verdict
		why     string
		after   time.Duration
		pending verdict
	}{
		{name: "a VM using the Secret is adopted", vm: testVM("uid-1", "storage/main"), secret: testSecret(), want: adopt},
		{name: "an adopted Secret is kept", vm: testVM("uid-1", "storage/main"), secret: testSecret(ownedByVM("uid-1")), want: keep},
		{name: "a re-created VM (new UID) adopts the Secret again", vm: testVM("uid-2", "storage/main"), secret: testSecret(ownedByVM("uid-1")), want: adopt},
		{name: "a Secret its VM owns without controlling it is adopted again, as its controller", vm: testVM("uid-1", "storage/main"),
			secret: testSecret(ownerOnly("uid-1")), want: adopt},
		{name: "a Secret another object controls is never adopted", vm: testVM("uid-1", "storage/main"),
			secret: testSecret(func(s *corev1.Secret) {
				s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d", Controller: ptr.To(true)}}
			}), want: leave, why: "controlled by Deployment web"},
		{name: "a password being hashed is not adopted yet (the Hasher's write would conflict)", vm: testVM("uid-1", "storage/main"),
			secret: testSecret(rotated), want: leave, why: "waiting for the password's hash"},
		{name: "a Secret without a password (nothing to hash) is adopted", vm: testVM("uid-1", "storage/main"),
			secret: testSecret(func(s *corev1.Secret) { delete(s.Data, v1alpha1.SecretKeyPassword) }), want: adopt},
		{name: "a Secret adopted before its rotation is kept while the new password is hashed", vm: testVM("uid-1", "storage/main"),
			secret: testSecret(ownedByVM("uid-1"), rotated), want: keep},
		{name: "an opted-out VM's Secret is revoked even while its password is hashed", vm: testVM("uid-1", ""),
			secret: testSecret(rotated), want: revoke},
		{name: "a VM not stored yet is left alone", vm: testVM("", "storage/main"), secret: testSecret(), want: leave, why: "no UID"},

		{name: "an opted-out VM's Secret is revoked", vm: testVM("uid-1", ""), secret: testSecret(ownedByVM("uid-1")),
			want: revoke, why: "no longer has annotation guestbackup.io/server"},
		{name: "a VM that names another server has its Secret revoked", vm: testVM("uid-1", "storage/other"), secret: testSecret(ownedByVM("uid-1")),
			want: revoke, why: "names storage/other instead"},
		{name: "a VM being deleted has its Secret revoked", vm: deleting(testVM("uid-1", "storage/main")), secret: testSecret(ownedByVM("uid-1")),
			want: revoke, why: "being deleted"},
		{name: "a Secret just rewritten for another server waits for the VM the webhook admitted", vm: testVM("uid-1", "storage/old"),
			secret: testSecret(ownedByVM("uid-1"), writtenBy("webhook", 10*time.Second)), want: wait, after: 20 * time.Second, pending: revoke},

		{name: "a deleted VM's adopted Secret is collected", secret: testSecret(ownedByVM("uid-1")), want: collect, why: "was deleted"},
		{name: "a deleted VM's Secret written moments ago waits", secret: testSecret(ownedByVM("uid-1"), writtenBy("webhook", 5*time.Second)),
			want: wait, after: 25 * time.Second, pending: collect},
		{name: "an orphan within its grace period is kept", secret: testSecret(created(time.Minute)),
			want: wait, after: 9 * time.Minute, pending: collect, why: "never appeared within 10m0s"},
		{name: "an orphan past its grace period is collected", secret: testSecret(created(11 * time.Minute)),
			want: collect, why: "never appeared within 10m0s of admission"},
		{name: "an orphan past its grace period but written moments ago waits", secret: testSecret(created(11*time.Minute), writtenBy("controller", 10*time.Second)),
			want: wait, after: 20 * time.Second, pending: collect},
		{name: "an owner that is not a VirtualMachine does not make the Secret adopted",
			secret: testSecret(created(time.Minute), func(s *corev1.Secret) {
				s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d"}}
			}),
			want: wait, after: 9 * time.Minute, pending: collect},

		{name: "a Secret not managed by guestbackup is never deleted when its VM opts out", vm: testVM("uid-1", ""),
			secret: testSecret(withoutLabel(v1alpha1.LabelManagedBy)), want: leave, why: "not labelled app.kubernetes.io/managed-by=guestbackup"},
		{name: "a Secret not managed by guestbackup is never deleted when its VM is gone", secret: testSecret(withoutLabel(v1alpha1.LabelManagedBy), ownedByVM("uid-1")),
			want: leave},
		{name: "a Secret not managed by guestbackup is never collected as an orphan", secret: testSecret(withoutLabel(v1alpha1.LabelManagedBy), created(time.Hour)),
			want: leave},
		{name: "a Secret not managed by guestbackup is not adopted", vm: testVM("uid-1", "storage/main"), secret: testSecret(withoutLabel(v1alpha1.LabelManagedBy)),
			want: leave},
		{name: "a Secret labelled for another VM is left alone", secret: testSecret(func(s *corev1.Secret) { s.Labels[v1alpha1.LabelVM] = "db" }),
			want: leave},
		{name: "a Secret without a VM label is left alone", secret: testSecret(withoutLabel(v1alpha1.LabelVM)), want: leave},
		{name: "a Secret being deleted is left alone", vm: testVM("uid-1", ""), secret: testSecret(func(s *corev1.Secret) {
			s.DeletionTimestamp = &metav1.Time{Time: now}
		}), want: leave},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := decide(tc.vm, tc.secret, now, defaults)
			if got.verdict != tc.want {
				t.Fatalf("verdict %s (%s), want %s", got.verdict, got.why, tc.want)
			}
			if !strings.Contains(got.why, tc.why) {
				t.Errorf("why %q, want it to contain %q", got.why, tc.why)
			}
			if got.verdict == wait && (got.after != tc.after || got.pending != tc.pending) {
				t.Errorf("wait %s for %s, want %s for %s", got.after, got.pending, tc.after, tc.pending)
			}
		})
	}
}

// TestDecideNeverDeletesEarly walks the clock over an orphan's life: it is
// kept until the grace period ends, and collected from then on.
func TestDecideNeverDeletesEarly(t *testing.T) {
	s := testSecret(created(0))
	for d := time.Duration(0); d < 12*time.Minute; d += 10 * time.Second {
		got := decide(nil, s, now.Add(d), defaults)
		switch {
		case d < 10*time.Minute && got.verdict != wait:
			t.Fatalf("at +%s: %s, want wait", d, got.verdict)
		case d < 10*time.Minute && now.Add(d).Add(got.after) != now.Add(10*time.Minute):
			t.Fatalf("at +%s: wait %s, want until +10m", d, got.after)
		case d >= 10*time.Minute && got.verdict != collect:
			t.Fatalf("at +%s: %s, want collect", d, got.verdict)
		}
	}
}

func TestLastWrite(t *testing.T) {
	s := testSecret(created(time.Hour), writtenBy("hasher", 5*time.Minute), writtenBy("webhook", 20*time.Minute))
	if got, want := lastWrite(s), now.Add(-5*time.Minute); !got.Equal(want) {
		t.Errorf("lastWrite = %s, want %s (the latest manager's change)", got, want)
	}
	s.ManagedFields = nil
	if got, want := lastWrite(s), now.Add(-time.Hour); !got.Equal(want) {
		t.Errorf("lastWrite without managedFields = %s, want the creation time %s", got, want)
	}
}

func TestAnnouncement(t *testing.T) {
	bsls := types.NamespacedName{Namespace: "storage", Name: "main"}
	for _, tc := range []struct {
		previous        announced
		generation      string
		reason, message string
	}{
		{announced{}, "1", ReasonUserProvisioned, "User web@team-a provisioned on BackupStorageLocationServer storage/main (credentials generation 1)"},
		{announced{"storage/main", "1"}, "2", ReasonCredentialsRotated,
			"User web@team-a on BackupStorageLocationServer storage/main: credentials rotated from generation 1 to 2; the previous password no longer authenticates"},
		{announced{"storage/main", "2"}, "7", ReasonCredentialsRotated, "rotated from generation 2 to 7"},
		// The VM moved here from another server: its first user here.
		{announced{"storage/old", "2"}, "3", ReasonUserProvisioned, "User web@team-a provisioned on BackupStorageLocationServer storage/main (credentials generation 3)"},
	} {
		reason, message := announcement("web@team-a", bsls, tc.previous, tc.generation)
		if reason != tc.reason || !strings.Contains(message, tc.message) {
			t.Errorf("announcement(%+v, %q) = %s %q, want %s %q", tc.previous, tc.generation, reason, message, tc.reason, tc.message)
		}
	}
	if !(announced{"storage/main", "2"}).covers(bsls, "2") {
		t.Error("generation 2 on storage/main announced, but not covered")
	}
	for _, a := range []announced{{"storage/main", "1"}, {"storage/old", "2"}, {"", "2"}, {}} {
		if a.covers(bsls, "2") {
			t.Errorf("%+v covers generation 2 on storage/main", a)
		}
	}
}

func TestVMChanged(t *testing.T) {
	p := vmChanged()
	base := testVM("uid-1", "storage/main")
	// A status update changes the resourceVersion only, as far as
	// metadata tells.
	statusOnly := base.DeepCopy()
	statusOnly.ResourceVersion = "2"
	relabelled := base.DeepCopy()
	relabelled.Labels = map[string]string{"team": "a"}
	optedOut := testVM("uid-1", "")
	otherServer := testVM("uid-1", "storage/other")
	for _, tc := range []struct {
		name string
		new  *metav1.PartialObjectMetadata
		want bool
	}{
		{"a status update", statusOnly, false},
		{"a label added", relabelled, false},
		{"the opt-in annotation removed", optedOut, true},
		{"another server named", otherServer, true},
		{"deletion started", deleting(base.DeepCopy()), true},
	} {
		if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: tc.new}); got != tc.want {
			t.Errorf("%s: passes = %t, want %t", tc.name, got, tc.want)
		}
	}
	if !p.Create(event.CreateEvent{Object: base}) || !p.Delete(event.DeleteEvent{Object: base}) {
		t.Error("creation and deletion of a VM must pass")
	}
}

// TestVolumeReading: which of a VM's volumes reads the Secret; which
// fields read one is vmsecret.SecretsRead's (its own table).
func TestVolumeReading(t *testing.T) {
	reads := func(name string) kubevirtv1.Volume {
		return kubevirtv1.Volume{Name: name, VolumeSource: kubevirtv1.VolumeSource{CloudInitConfigDrive: &kubevirtv1.CloudInitConfigDriveSource{
			UserData: "#cloud-config\n", NetworkDataSecretRef: &corev1.LocalObjectReference{Name: "web-guestbackup"},
		}}}
	}
	other := kubevirtv1.Volume{Name: "own", VolumeSource: kubevirtv1.VolumeSource{Secret: &kubevirtv1.SecretVolumeSource{SecretName: "web-own"}}}
	for _, tt := range []struct {
		name    string
		volumes []kubevirtv1.Volume
		want    string
	}{
		{"the one that reads it", []kubevirtv1.Volume{other, reads("v")}, "v"},
		{"the first of two", []kubevirtv1.Volume{reads("a"), reads("b")}, "a"},
		{"none", []kubevirtv1.Volume{other}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vm := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{Volumes: tt.volumes},
			}}}
			if got := volumeReading(vm, "web-guestbackup"); got != tt.want {
				t.Errorf("volumeReading = %q, want %q", got, tt.want)
			}
		})
	}
	if got := volumeReading(&kubevirtv1.VirtualMachine{}, "web-guestbackup"); got != "" {
		t.Errorf("a VM without a template: %q", got)
	}
}
