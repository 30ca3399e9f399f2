package kopiaserver

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

func TestDecideCAGuard(t *testing.T) {
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}}
	deleted := metav1.Now()
	ca := func(key string, finalizers []string, deleting bool, annotations map[string]string) *corev1.Secret {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "main-ca", Namespace: "backup", Finalizers: finalizers, Annotations: annotations},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: []byte("cert of " + key), corev1.TLSPrivateKeyKey: []byte(key)},
		}
		if deleting {
			s.DeletionTimestamp = &deleted
		}
		return s
	}
	guard := []string{FinalizerCAGuard}
	rescueOf := func(s *corev1.Secret) *corev1.Secret {
		r, err := rescueSecret(b, s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	replace := map[string]string{AnnotationReplaceCA: "key compromised"}
	// cert-manager's CA Certificate never rotates its key: what it issues
	// again is a new certificate for the same key.
	reissued := ca("k1", guard, false, nil)
	reissued.Data[corev1.TLSCertKey] = []byte("another cert of k1")

	for _, tc := range []struct {
		name       string
		ca, rescue *corev1.Secret
		hold       bool
		want       caGuardAction
	}{
		{"no CA yet: the certificate step issues one", nil, nil, false, caSettled},
		{"a CA without the guard gets it", ca("k1", nil, false, nil), nil, false, caGuard},
		{"a guarded CA is left alone", ca("k1", guard, false, nil), nil, false, caSettled},
		{"a guarded CA being deleted is copied aside first", ca("k1", guard, true, nil), nil, false, caRescue},
		{"once copied aside, it is let go", ca("k1", guard, true, nil), rescueOf(ca("k1", nil, false, nil)), false, caRelease},
		{"while the API server finishes the deletion, wait", ca("k1", nil, true, nil), rescueOf(ca("k1", nil, false, nil)), false, caWait},
		{"once gone, it is re-created from the copy", nil, rescueOf(ca("k1", nil, false, nil)), false, caRestore},
		{"re-issued meanwhile by another writer (cert-manager): the old key pair is put back", ca("k2", nil, false, nil), rescueOf(ca("k1", nil, false, nil)), false, caRestore},
		{"back with the same key pair: the copy goes and the admin is told", ca("k1", guard, false, nil), rescueOf(ca("k1", nil, false, nil)), false, caRestored},
		{"re-issued by cert-manager with the same key: the rescued certificate is put back", reissued, rescueOf(ca("k1", nil, false, nil)), false, caRestore},
		{"restored while cert-manager may still write it (it saw the Secret gone): keep the copy until it is done", ca("k1", guard, false, nil), rescueOf(ca("k1", nil, false, nil)), true, caWait},
		{"a deletion marked as a replacement is let through, no copy kept", ca("k1", guard, true, replace), nil, false, caRelease},
		{"a deletion not guarded by us is not ours to stop", ca("k1", []string{"other/finalizer"}, true, nil), nil, false, caSettled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideCAGuard(tc.ca, tc.rescue, tc.hold); got != tc.want {
				t.Errorf("decideCAGuard = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestRescueSecretRestoresWhatWasDeleted(t *testing.T) {
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}}
	deleted := metav1.Now()
	ca := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "main-ca", Namespace: "backup", UID: "old-uid", ResourceVersion: "42", DeletionTimestamp: &deleted,
			Finalizers:  []string{FinalizerCAGuard},
			Labels:      map[string]string{"guestbackup.io/bsls": "main"},
			Annotations: map[string]string{"cert-manager.io/certificate-name": "main-ca", AnnotationKeep: "kept"},
		},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: []byte("cert"), corev1.TLSPrivateKeyKey: []byte("key"), "ca.crt": []byte("cert")},
	}
	rescue, err := rescueSecret(b, ca)
	if err != nil {
		t.Fatal(err)
	}
	if rescue.Name != "main-ca-rescue" || rescue.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
		t.Errorf("rescue Secret %s, labels %v: want main-ca-rescue, guestbackup's labels (only guestbackup may write it)", rescue.Name, rescue.Labels)
	}
	got, err := rescuedSecret(rescue)
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != "" || got.ResourceVersion != "" || got.DeletionTimestamp != nil {
		t.Errorf("restored Secret keeps the deleted object's identity: uid %q, resourceVersion %q, deletion %v", got.UID, got.ResourceVersion, got.DeletionTimestamp)
	}
	if got.Name != "main-ca" || got.Namespace != "backup" || got.Type != corev1.SecretTypeTLS ||
		got.Annotations["cert-manager.io/certificate-name"] != "main-ca" || got.Labels["guestbackup.io/bsls"] != "main" ||
		string(got.Data[corev1.TLSPrivateKeyKey]) != "key" || string(got.Data["ca.crt"]) != "cert" {
		t.Errorf("restored Secret differs from the deleted one: %+v", got)
	}
	if len(got.Finalizers) != 1 || got.Finalizers[0] != FinalizerCAGuard {
		t.Errorf("restored Secret finalizers %v, want guarded again", got.Finalizers)
	}

	if _, err := rescuedSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "main-ca-rescue"}, Data: map[string][]byte{caRescueKey: []byte(`{"data":{}}`)}}); err == nil ||
		!strings.Contains(err.Error(), "no CA certificate and key") {
		t.Errorf("a rescue without a key pair: error %v, want it refused", err)
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
