package credentials

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

func TestKeepPrevious(t *testing.T) {
	issued := time.Date(2026, 3, 1, 12, 0, 0, 500_000_000, time.UTC)
	grace := time.Hour
	// instance is an instance created an hour before the rotation, in
	// phase, with the phase transitions virt-controller and virt-handler
	// record (phase, at).
	instance := func(phase kubevirtv1.VirtualMachineInstancePhase, transitions ...any) *kubevirtv1.VirtualMachineInstance {
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(issued.Add(-time.Hour))}}
		vmi.Status.Phase = phase
		for i := 0; i < len(transitions); i += 2 {
			vmi.Status.PhaseTransitionTimestamps = append(vmi.Status.PhaseTransitionTimestamps, kubevirtv1.VirtualMachineInstancePhaseTransitionTimestamp{
				Phase: transitions[i].(kubevirtv1.VirtualMachineInstancePhase), PhaseTransitionTimestamp: metav1.NewTime(transitions[i+1].(time.Time)),
			})
		}
		return vmi
	}
	sec := func(d time.Duration) time.Time { return issued.Add(d).Truncate(time.Second) }
	before, after := sec(-30*time.Minute), sec(time.Minute)
	for name, tc := range map[string]struct {
		instance     *kubevirtv1.VirtualMachineInstance
		now          time.Time
		keep, forced bool
		why          string
	}{
		"stopped VM": {nil, issued.Add(time.Minute), false, false, "runs no instance"},
		"launcher started before, guest running": {instance(kubevirtv1.Running, kubevirtv1.Pending, before, kubevirtv1.Scheduling, before,
			kubevirtv1.Scheduled, before, kubevirtv1.Running, before), issued.Add(time.Minute), true, false, "started at 2026-03-01T11:30:00Z, before the rotation"},
		"launcher started before, guest not yet running": {instance(kubevirtv1.Scheduled, kubevirtv1.Scheduled, before), issued.Add(time.Minute), true, false, "before the rotation"},
		// The instance was created before the rotation, but its launcher
		// pod was Pending across it: it reads the new password.
		"created before, launcher pending":  {instance(kubevirtv1.Scheduling, kubevirtv1.Pending, before, kubevirtv1.Scheduling, before), issued.Add(time.Minute), false, false, "has not started yet"},
		"created before, not yet scheduled": {instance(kubevirtv1.Pending, kubevirtv1.Pending, before), issued.Add(time.Minute), false, false, "has not started yet"},
		"created before, no status yet":     {instance(""), issued.Add(time.Minute), false, false, "has not started yet"},
		"created before, launcher started after": {instance(kubevirtv1.Running, kubevirtv1.Scheduling, before, kubevirtv1.Scheduled, after,
			kubevirtv1.Running, after), issued.Add(2 * time.Minute), false, false, "started at 2026-03-01T12:01:00Z, after the rotation"},
		"launcher started in the same second":  {instance(kubevirtv1.Running, kubevirtv1.Scheduled, sec(0)), issued.Add(time.Minute), false, false, "after the rotation"},
		"launcher started the second before":   {instance(kubevirtv1.Running, kubevirtv1.Scheduled, sec(-time.Second)), issued.Add(time.Minute), true, false, "before the rotation"},
		"guest stopped, instance not yet gone": {instance(kubevirtv1.Succeeded, kubevirtv1.Scheduled, before, kubevirtv1.Succeeded, after), issued.Add(2 * time.Minute), false, false, "is Succeeded"},
		"guest failed":                         {instance(kubevirtv1.Failed, kubevirtv1.Scheduled, before), issued.Add(2 * time.Minute), false, false, "is Failed"},
		// No record of the launcher's start: the instance's creation,
		// the earliest it can have been.
		"running, no transition recorded": {instance(kubevirtv1.Running), issued.Add(time.Minute), true, false, "started at 2026-03-01T11:00:00Z, before the rotation"},
		"grace ended":                     {instance(kubevirtv1.Running, kubevirtv1.Scheduled, before), issued.Add(grace), false, true, "grace period of 1h0m0s ended"},
	} {
		t.Run(name, func(t *testing.T) {
			got := KeepPrevious(issued, tc.instance, tc.now, grace)
			if got.Keep != tc.keep || got.Forced != tc.forced || !strings.Contains(got.Why, tc.why) || !got.Until.Equal(issued.Add(grace)) {
				t.Errorf("KeepPrevious = %+v, want keep %v, forced %v, why containing %q, until %v", got, tc.keep, tc.forced, tc.why, issued.Add(grace))
			}
		})
	}
}

// The server keeps the previous hash while a rotation waits, the stale one
// while the new password is hashed, and the current one otherwise: a
// rotation never leaves the user without a hash.
func TestHashForDuringARotation(t *testing.T) {
	secret := func(data map[string]string) *corev1.Secret {
		s := &corev1.Secret{Data: map[string][]byte{}}
		s.Labels = vmsecret.Labels("web", types.NamespacedName{Namespace: "storage", Name: "main"})
		vmsecret.SetAnnounced(s, "storage/main", "1")
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	h1, h2 := testHash(t, "the first password"), testHash(t, "the second password")
	for name, tc := range map[string]struct {
		data          map[string]string
		moved         bool
		server, owner string
	}{
		"first generation, not hashed": {map[string]string{vmsecret.KeyGeneration: "1"}, false, "", ""},
		"first generation, hashed": {map[string]string{vmsecret.KeyGeneration: "1",
			vmsecret.KeyPasswordHash: h1, vmsecret.KeyPasswordHashGeneration: "1"}, false, h1, h1},
		"rotated, not hashed yet": {map[string]string{vmsecret.KeyGeneration: "2",
			vmsecret.KeyPasswordHash: h1, vmsecret.KeyPasswordHashGeneration: "1"}, false, h1, ""},
		"moved to another server, not hashed yet": {map[string]string{vmsecret.KeyGeneration: "2",
			vmsecret.KeyPasswordHash: h1, vmsecret.KeyPasswordHashGeneration: "1"}, true, "", ""},
		"rotated, waiting for the guest": {map[string]string{vmsecret.KeyGeneration: "2",
			vmsecret.KeyPasswordHash: h2, vmsecret.KeyPasswordHashGeneration: "2",
			vmsecret.KeyPreviousPasswordHash: h1, vmsecret.KeyPreviousPasswordHashGeneration: "1", vmsecret.KeyPreviousPasswordHashServer: "storage/main"}, false, h1, h2},
		// The webhook keeps the controller's keys when the VM names
		// another server: the password rotated out on the first must not
		// authenticate on the second.
		"rotated, then moved to another server": {map[string]string{vmsecret.KeyGeneration: "2",
			vmsecret.KeyPasswordHash: h2, vmsecret.KeyPasswordHashGeneration: "2",
			vmsecret.KeyPreviousPasswordHash: h1, vmsecret.KeyPreviousPasswordHashGeneration: "1", vmsecret.KeyPreviousPasswordHashServer: "storage/main"}, true, h2, h2},
		"rotated, done": {map[string]string{vmsecret.KeyGeneration: "2",
			vmsecret.KeyPasswordHash: h2, vmsecret.KeyPasswordHashGeneration: "2"}, false, h2, h2},
	} {
		t.Run(name, func(t *testing.T) {
			s := secret(tc.data)
			if tc.moved {
				s.Labels[vmsecret.LabelServerName] = "second"
			}
			if got := hashText(HashFor(s)); got != tc.server {
				t.Errorf("HashFor = %q, want %q", got, tc.server)
			}
			if got := hashText(CurrentHash(s)); got != tc.owner {
				t.Errorf("CurrentHash = %q, want %q", got, tc.owner)
			}
		})
	}
}

// A second rotation while the first one's password is kept never extends
// how long that password is accepted: the grace period runs from the first.
func TestGraceStart(t *testing.T) {
	first := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	second := first.Add(20 * time.Hour)
	secret := func(previous *vmsecret.Previous) *corev1.Secret {
		s := &corev1.Secret{Data: map[string][]byte{}}
		s.Labels = vmsecret.Labels("web", types.NamespacedName{Namespace: "storage", Name: "main"})
		s.Annotations = map[string]string{vmsecret.AnnotationIssuedAt: second.Format(time.RFC3339Nano)}
		vmsecret.SetPreviousHash(s, previous)
		return s
	}
	for name, tc := range map[string]struct {
		previous *vmsecret.Previous
		want     time.Time
	}{
		"no password kept: the current rotation":   {nil, second},
		"a password kept since the first rotation": {&vmsecret.Previous{Hash: "h1", Generation: "1", Server: "storage/main", Since: first}, first},
		"a password kept on another server":        {&vmsecret.Previous{Hash: "h1", Generation: "1", Server: "storage/old", Since: first}, second},
	} {
		t.Run(name, func(t *testing.T) {
			if got := GraceStart(secret(tc.previous)); !got.Equal(tc.want) {
				t.Errorf("GraceStart = %v, want %v", got, tc.want)
			}
		})
	}
}

func testHash(t *testing.T, password string) string {
	t.Helper()
	h, err := identity.NewHash(password, identity.PBKDF2)
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

func hashText(h *identity.Hash) string {
	if h == nil {
		return ""
	}
	return h.String()
}

func TestHashVersionOf(t *testing.T) {
	for choice, want := range map[v1alpha1.PasswordHash]identity.HashVersion{
		v1alpha1.PasswordHashScrypt: identity.Scrypt,
		v1alpha1.PasswordHashPBKDF2: identity.PBKDF2,
		"":                          identity.PBKDF2, // the fallback
	} {
		if got := HashVersionOf(choice, identity.PBKDF2); got != want {
			t.Errorf("HashVersionOf(%q) = %d, want %d", choice, got, want)
		}
	}
}

// A BSLS the cache has not seen yet, created with its VMs, decides its
// users' algorithm all the same: the hash is made once and kept.
func TestHashVersionReadsAroundACacheThatMissesTheBSLS(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "fips", Namespace: "backup"},
		Spec:       v1alpha1.BackupStorageLocationServerSpec{Access: v1alpha1.AccessSpec{PasswordHash: v1alpha1.PasswordHashPBKDF2}},
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-guestbackup", Namespace: "vms", Labels: map[string]string{
		v1alpha1.LabelServerNamespace: "backup", v1alpha1.LabelServerName: "fips",
	}}}
	cache := fake.NewClientBuilder().WithScheme(scheme).Build()
	for _, tc := range []struct {
		name   string
		reader client.Reader
		want   identity.HashVersion
	}{
		{"the API server holds it", fake.NewClientBuilder().WithScheme(scheme).WithObjects(bsls).Build(), identity.PBKDF2},
		{"it does not exist: the default", fake.NewClientBuilder().WithScheme(scheme).Build(), identity.Scrypt},
	} {
		got, err := (&Hasher{Client: cache, APIReader: tc.reader}).hashVersion(context.Background(), secret)
		if err != nil || got != tc.want {
			t.Errorf("%s: hashVersion = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}
