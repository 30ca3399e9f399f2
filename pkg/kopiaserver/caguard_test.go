package kopiaserver

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// testCA is a CA key pair as Secret <bsls>-ca holds it, and its pin.
type testCA struct {
	crt, key []byte
	pin      string
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	ca, err := pki.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return testCA{crt: ca.CertPEM(), key: key, pin: pki.Fingerprint(ca.Cert)}
}

// caGuardFixture builds the Secrets the CA guard sees, for BSLS backup/main
// whose guests trust k1.
type caGuardFixture struct {
	t      *testing.T
	b      *v1alpha1.BackupStorageLocationServer
	k1, k2 testCA
}

func newCAGuardFixture(t *testing.T) caGuardFixture {
	k1, k2 := newTestCA(t, "k1"), newTestCA(t, "k2")
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}}
	b.Status.TLSFingerprint = k1.pin
	return caGuardFixture{t: t, b: b, k1: k1, k2: k2}
}

// ca is Secret main-ca holding k, with uid, finalizers, annotations, and
// being deleted or not.
func (f caGuardFixture) ca(k testCA, uid types.UID, finalizers []string, deleting bool, annotations map[string]string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "main-ca", Namespace: "backup", UID: uid, Finalizers: finalizers, Annotations: annotations, Labels: Labels(f.b)},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: k.crt, corev1.TLSPrivateKeyKey: k.key, "ca.crt": k.crt},
	}
	if deleting {
		deleted := metav1.Now()
		s.DeletionTimestamp = &deleted
	}
	return s
}

// rescue is the rescue Secret the controller makes of ca, with extra
// annotations (its stamps).
func (f caGuardFixture) rescue(ca *corev1.Secret, stamps map[string]string) *corev1.Secret {
	r, err := rescueSecret(f.b, ca)
	if err != nil {
		f.t.Fatal(err)
	}
	maps.Copy(r.Annotations, stamps)
	return r
}

func TestDecideCAGuard(t *testing.T) {
	f := newCAGuardFixture(t)
	guard := []string{FinalizerCAGuard}
	replace := map[string]string{AnnotationReplaceCA: "key compromised"}
	released := map[string]string{annotationCAReleasedAt: "2026-01-01T00:00:00Z"}
	deleting := f.ca(f.k1, "uid-1", guard, true, nil)
	rescue := f.rescue(deleting, nil)
	releasedRescue := f.rescue(deleting, released)
	// What a tenant may create by the rescue's name: no labels, no UID,
	// another CA.
	forged := f.rescue(f.ca(f.k2, "uid-1", nil, false, nil), nil)
	forged.Labels = nil
	// (a) A corrupt CA Secret (TLSSecretInvalid: "fix Secret ... or
	// annotate it ... and delete it"), and the copy an earlier release
	// made of it when it was deleted.
	corrupt := f.ca(f.k1, "uid-1", guard, true, nil)
	corrupt.Data[corev1.TLSCertKey] = []byte("not a certificate")
	corruptCopy := f.rescue(corrupt, nil)

	for _, tc := range []struct {
		name     string
		ca       *corev1.Secret
		rescue   *corev1.Secret
		noPin    bool
		certMgr  bool
		hold     bool
		expired  bool
		want     caGuardAction
		untusted bool
	}{
		{name: "no CA yet: the certificate step issues one", want: caSettled},
		{name: "a CA without the guard gets it", ca: f.ca(f.k1, "uid-1", nil, false, nil), want: caGuard},
		{name: "a guarded CA is left alone", ca: f.ca(f.k1, "uid-1", guard, false, nil), want: caSettled},
		{name: "a guarded CA being deleted is copied aside first", ca: deleting, want: caRescue},
		{name: "once copied aside, it is let go", ca: deleting, rescue: rescue, want: caRelease},
		{name: "while the API server finishes the deletion, wait", ca: f.ca(f.k1, "uid-1", nil, true, nil), rescue: releasedRescue, want: caWait},
		{name: "released, but kept terminating by another party's finalizer: wait, backing off", ca: f.ca(f.k1, "uid-1", []string{"other/finalizer"}, true, nil), rescue: releasedRescue, want: caWaitOthers},
		{name: "once gone, it is re-created from the copy", rescue: releasedRescue, want: caRestore},
		{name: "back with the same key pair: the copy goes and the admin is told", ca: f.ca(f.k1, "uid-2", guard, false, nil), rescue: releasedRescue, want: caRestored},
		{name: "back while cert-manager may still write it: keep the copy until it settles", ca: f.ca(f.k1, "uid-2", guard, false, nil), rescue: releasedRescue, certMgr: true, hold: true, want: caWait},
		{name: "issued again by cert-manager (a new key) within its hold: the rescued key pair is put back", ca: f.ca(f.k2, "uid-2", nil, false, nil), rescue: releasedRescue, certMgr: true, hold: true, want: caRestore},
		{name: "issued again by cert-manager after its hold settled, within its bound: put back", ca: f.ca(f.k2, "uid-2", nil, false, nil), rescue: releasedRescue, certMgr: true, want: caRestore},
		{name: "issued again by cert-manager past the hold's bound: left as it is, and said", ca: f.ca(f.k2, "uid-2", nil, false, nil), rescue: releasedRescue, certMgr: true, expired: true, want: caAbandon},
		{name: "written with another CA by another writer than cert-manager: never written over", ca: f.ca(f.k2, "uid-2", nil, false, nil), rescue: releasedRescue, want: caAbandon},
		{name: "a live CA is never written over from a copy that was never released (a stale copy)", ca: f.ca(f.k2, "uid-2", guard, false, nil), rescue: rescue, certMgr: true, hold: true, want: caAbandon},
		{name: "a stale copy of the live CA is deleted, quietly", ca: f.ca(f.k1, "uid-1", guard, false, nil), rescue: rescue, want: caDiscard},
		{name: "a deletion marked as a replacement is let through, no copy kept", ca: f.ca(f.k1, "uid-1", guard, true, replace), want: caRelease},
		{name: "a replacement marked after the copy was made: the copy goes first", ca: f.ca(f.k1, "uid-1", guard, true, replace), rescue: rescue, want: caDiscard},
		{name: "a deletion not guarded by us is not ours to stop", ca: f.ca(f.k1, "uid-1", []string{"other/finalizer"}, true, nil), want: caSettled},
		{name: "forged rescue, live CA: ignored, the CA stays", ca: f.ca(f.k1, "uid-1", guard, false, nil), rescue: forged, want: caSettled, untusted: true},
		{name: "forged rescue, no CA: ignored, a new CA is issued", rescue: forged, want: caSettled, untusted: true},
		{name: "forged rescue holding the name when the CA is deleted: the CA is held, readable", ca: deleting, rescue: forged, want: caBlocked, untusted: true},
		{name: "forged rescue and a replacement: let through", ca: f.ca(f.k1, "uid-1", guard, true, replace), rescue: forged, want: caRelease, untusted: true},
		{name: "(a) a corrupt CA being deleted: no guest trusts it, let go without a copy", ca: corrupt, want: caLetGo},
		{name: "(a) the copy an earlier release made of the corrupt CA being deleted: deleted, no blocker", ca: corrupt, rescue: corruptCopy, want: caDiscard, untusted: true},
		{name: "(a) a corrupt CA being deleted and a forged rescue: let go without a copy", ca: corrupt, rescue: forged, want: caLetGo, untusted: true},
		{name: "(b) no pin yet (certificate pending or invalid since creation): let go without a copy", ca: deleting, noPin: true, want: caLetGo},
		{name: "(b) no pin yet, and its own copy (never trusted): deleted, no blocker", ca: deleting, rescue: rescue, noPin: true, want: caDiscard, untusted: true},
		{name: "(c) cert-manager's new CA deleted while the pin still names the replaced one: let go without a copy", ca: f.ca(f.k2, "uid-2", guard, true, nil), certMgr: true, want: caLetGo},
		{name: "(c) ... with its own copy made (never trusted): deleted, no blocker", ca: f.ca(f.k2, "uid-2", guard, true, nil), rescue: f.rescue(f.ca(f.k2, "uid-2", guard, true, nil), nil), certMgr: true, want: caDiscard, untusted: true},
		{name: "a CA guests trust keeps the forged rescue a blocker", ca: deleting, rescue: forged, want: caBlocked, untusted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := f.b.DeepCopy()
			if tc.noPin {
				b.Status.TLSFingerprint = ""
			}
			in := caGuardInputs{CA: tc.ca, Rescue: tc.rescue, Pin: b.Status.TLSFingerprint, OwnCopy: ownRescue(b, tc.ca, tc.rescue), CertManager: tc.certMgr, Hold: tc.hold, Expired: tc.expired}
			if tc.rescue != nil {
				var why string
				in.Restored, why = trustRescue(b, tc.ca, tc.rescue)
				if (in.Restored == nil) != tc.untusted {
					t.Fatalf("trustRescue = %v (%s), want trusted %t", in.Restored != nil, why, !tc.untusted)
				}
			}
			if got := decideCAGuard(in); got != tc.want {
				t.Errorf("decideCAGuard = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestTrustRescue(t *testing.T) {
	f := newCAGuardFixture(t)
	deleting := f.ca(f.k1, "uid-1", []string{FinalizerCAGuard}, true, map[string]string{"cert-manager.io/certificate-name": "main-ca", AnnotationKeep: "kept"})
	deleting.ResourceVersion = "42"
	deleting.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "x"}}
	genuine := f.rescue(deleting, nil)
	with := func(edit func(saved *corev1.Secret, rescue *corev1.Secret)) *corev1.Secret {
		r := genuine.DeepCopy()
		saved := &corev1.Secret{}
		if err := json.Unmarshal(r.Data[caRescueKey], saved); err != nil {
			t.Fatal(err)
		}
		edit(saved, r)
		raw, err := json.Marshal(saved)
		if err != nil {
			t.Fatal(err)
		}
		r.Data[caRescueKey] = raw
		return r
	}

	for _, tc := range []struct {
		name   string
		ca     *corev1.Secret
		rescue *corev1.Secret
		why    string
	}{
		{"the copy the controller made of the CA being deleted", deleting, genuine, ""},
		{"the same copy once the CA is gone", nil, genuine, ""},
		{"forged: unlabelled", nil, with(func(_, r *corev1.Secret) { r.Labels = nil }), "not labelled as guestbackup's"},
		{"forged: labelled, without managed-by", nil, with(func(_, r *corev1.Secret) { delete(r.Labels, v1alpha1.LabelManagedBy) }), "not labelled as guestbackup's"},
		{"forged: labelled, without the source UID", nil, with(func(_, r *corev1.Secret) { delete(r.Annotations, annotationCASourceUID) }), "names no CA Secret"},
		{"forged: labelled, another CA (the wrong pin)", nil, with(func(s, _ *corev1.Secret) {
			s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = f.k2.crt, f.k2.key
		}), "is not the one guests trust"},
		{"forged: the CA guests trust with another key", nil, with(func(s, _ *corev1.Secret) { s.Data[corev1.TLSPrivateKeyKey] = f.k2.key }), "not a matching certificate and key"},
		{"renamed: a copy of another Secret", nil, with(func(s, _ *corev1.Secret) { s.Name = "other" }), "copies Secret backup/other"},
		{"renamed: a copy from another namespace", nil, with(func(s, _ *corev1.Secret) { s.Namespace = "kube-system" }), "copies Secret kube-system/main-ca"},
		{"corrupt: not JSON", nil, func() *corev1.Secret { r := genuine.DeepCopy(); r.Data[caRescueKey] = []byte("{"); return r }(), "not a Secret in JSON"},
		{"corrupt: no key pair", nil, with(func(s, _ *corev1.Secret) { s.Data = nil }), "not a matching certificate and key"},
		{"stale: the copy of another Secret than the one being deleted, another CA", f.ca(f.k1, "uid-9", nil, true, nil), with(func(s, _ *corev1.Secret) {
			s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = f.k2.crt, f.k2.key
		}), "is not the one guests trust"},
		{"a copy of an earlier Secret with the very key pair being deleted is as good", f.ca(f.k1, "uid-9", nil, true, nil), genuine, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := trustRescue(f.b, tc.ca, tc.rescue)
			if tc.why == "" {
				if got == nil {
					t.Fatalf("refused: %s", why)
				}
				return
			}
			if got != nil || !strings.Contains(why, tc.why) {
				t.Errorf("trustRescue = %v, %q; want refused, saying %q", got != nil, why, tc.why)
			}
		})
	}

	t.Run("a stale copy that no status pin vouches for is refused", func(t *testing.T) {
		b := f.b.DeepCopy()
		b.Status.TLSFingerprint = ""
		if got, why := trustRescue(b, nil, genuine); got != nil || !strings.Contains(why, "is not the one guests trust") {
			t.Errorf("trustRescue = %v, %q; want refused", got != nil, why)
		}
	})

	t.Run("what is restored is Secret <bsls>-ca as it was, whatever the copy says of identity", func(t *testing.T) {
		r := with(func(s, _ *corev1.Secret) {
			s.Type = corev1.SecretTypeOpaque
			s.OwnerReferences = deleting.OwnerReferences
			s.Finalizers = []string{"other/finalizer"}
			s.Annotations[AnnotationReplaceCA] = "left over"
		})
		got, why := trustRescue(f.b, nil, r)
		if got == nil {
			t.Fatalf("refused: %s", why)
		}
		if got.Name != "main-ca" || got.Namespace != "backup" || got.Type != corev1.SecretTypeTLS || len(got.OwnerReferences) != 0 {
			t.Errorf("restored %s/%s type %s owners %v: want backup/main-ca, kubernetes.io/tls, no owners", got.Namespace, got.Name, got.Type, got.OwnerReferences)
		}
		if got.UID != "" || got.ResourceVersion != "" || got.DeletionTimestamp != nil {
			t.Errorf("restored Secret keeps the deleted object's identity: uid %q, resourceVersion %q, deletion %v", got.UID, got.ResourceVersion, got.DeletionTimestamp)
		}
		if !slices.Equal(got.Finalizers, []string{FinalizerCAGuard}) {
			t.Errorf("restored Secret finalizers %v, want guarded again, nothing else", got.Finalizers)
		}
		if got.Annotations["cert-manager.io/certificate-name"] != "main-ca" || got.Annotations[AnnotationKeep] != "kept" || got.Annotations[AnnotationReplaceCA] != "" {
			t.Errorf("restored annotations %v: want the deleted Secret's, without %s", got.Annotations, AnnotationReplaceCA)
		}
		if got.Labels[LabelBSLS] != "main" || !bytes.Equal(got.Data[corev1.TLSPrivateKeyKey], f.k1.key) || !bytes.Equal(got.Data["ca.crt"], f.k1.crt) {
			t.Errorf("restored Secret differs from the deleted one: labels %v", got.Labels)
		}
	})
}

func TestUntrustedCA(t *testing.T) {
	f := newCAGuardFixture(t)
	corrupt := f.ca(f.k1, "uid-1", nil, true, nil)
	corrupt.Data[corev1.TLSCertKey] = []byte("not a certificate")
	mismatched := f.ca(f.k1, "uid-1", nil, true, nil)
	mismatched.Data[corev1.TLSPrivateKeyKey] = f.k2.key
	for _, tc := range []struct {
		name string
		ca   *corev1.Secret
		pin  string
		next string
		why  string
	}{
		{"the pinned CA with its key", f.ca(f.k1, "uid-1", nil, true, nil), f.k1.pin, "", ""},
		{"corrupt", corrupt, f.k1.pin, "", "not a matching certificate and key"},
		{"the pinned certificate with another key", mismatched, f.k1.pin, "", "not a matching certificate and key"},
		{"no pin yet", f.ca(f.k1, "uid-1", nil, true, nil), "", "", "no CA is pinned yet"},
		{"another CA than the pin", f.ca(f.k2, "uid-1", nil, true, nil), f.k1.pin, "", "(SHA-256 " + f.k2.pin + ") is not the one guests trust"},
		{"the next CA of a rotation, switched to before the status says so", f.ca(f.k2, "uid-1", nil, true, nil), f.k1.pin, f.k2.pin, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := untrustedCA(tc.ca, tc.pin, tc.next)
			if (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
				t.Errorf("untrustedCA = %q, want %q", why, tc.why)
			}
			if strings.Contains(why, "PRIVATE KEY") || strings.Contains(why, string(f.k2.key[30:60])) {
				t.Errorf("untrustedCA quotes the key: %q", why)
			}
		})
	}
}

func TestCertManagerHold(t *testing.T) {
	f := newCAGuardFixture(t)
	released := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	stamp := func(written time.Time, revision string) *corev1.Secret {
		return f.rescue(f.ca(f.k1, "uid-1", nil, true, nil), map[string]string{
			annotationCAReleasedAt: released.Format(time.RFC3339Nano),
			annotationCAWrittenAt:  written.Format(time.RFC3339Nano),
			annotationCARevision:   revision,
		})
	}
	for _, tc := range []struct {
		name          string
		rescue        *corev1.Secret
		certMgr       bool
		now           time.Time
		revision      string
		issuing       bool
		hold, expired bool
	}{
		{"the controller's own CA: no hold", stamp(released, "1"), false, released, "1", true, false, false},
		{"just released", stamp(released, "1"), true, released.Add(time.Second), "1", false, true, false},
		{"settled: the write is older than caSettle, revision stable, not issuing", stamp(released, "1"), true, released.Add(caSettle), "1", false, false, false},
		{"cert-manager issuing", stamp(released, "1"), true, released.Add(time.Minute), "1", true, true, false},
		{"cert-manager wrote a revision since the controller's last write", stamp(released, "1"), true, released.Add(time.Minute), "2", false, true, false},
		{"a write-back restarts the settling", stamp(released.Add(time.Minute), "2"), true, released.Add(time.Minute + time.Second), "2", false, true, false},
		{"bounded: past caHoldLimit from the release, even while issuing", stamp(released.Add(4*time.Minute), "3"), true, released.Add(caHoldLimit + time.Second), "4", true, false, true},
		{"never released: no hold", f.rescue(f.ca(f.k1, "uid-1", nil, true, nil), nil), true, released, "1", true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hold, expired := certManagerHold(tc.now, tc.rescue, tc.certMgr, tc.revision, tc.issuing)
			if hold != tc.hold || expired != tc.expired {
				t.Errorf("certManagerHold = %t, %t; want %t, %t", hold, expired, tc.hold, tc.expired)
			}
		})
	}
}

func TestCAChange(t *testing.T) {
	for _, tc := range []struct {
		name, before, after string
		changed             bool
	}{
		{"a first CA is no change", "", "aa", false},
		{"the same CA", "aa", "aa", false},
		{"another CA", "aa", "bb", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, changed := caChange(tc.before, tc.after, "Secret admin-tls")
			if changed != tc.changed {
				t.Fatalf("changed = %t, want %t", changed, tc.changed)
			}
			if changed && !(strings.Contains(msg, "from SHA-256 aa to bb") && strings.Contains(msg, "until their VM restarts") && strings.Contains(msg, "Secret admin-tls")) {
				t.Errorf("message %q does not say which CAs, where from and what it costs the guests", msg)
			}
		})
	}
}
