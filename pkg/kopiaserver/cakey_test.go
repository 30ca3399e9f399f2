package kopiaserver

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/password"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

func TestCAKeySourceOf(t *testing.T) {
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}}
	generated := password.New()
	secret := func(annotations map[string]string, pw string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "main-repository", Annotations: annotations},
			Data:       map[string][]byte{"password": []byte(pw)},
		}
	}
	tests := []struct {
		name           string
		password       *corev1.Secret
		wantDerived    bool
		wantGeneration int
	}{
		{name: "no password Secret: random", password: nil},
		{name: "a password the controller generated: derived, generation 0", password: secret(map[string]string{AnnotationCAKeyGeneration: "0"}, generated), wantDerived: true},
		{name: "after two replacements: generation 2", password: secret(map[string]string{AnnotationCAKeyGeneration: "2"}, generated), wantDerived: true, wantGeneration: 2},
		{name: "a password the admin wrote (no annotation): random", password: secret(nil, generated)},
		{name: "a generation that is not a number: random", password: secret(map[string]string{AnnotationCAKeyGeneration: "two"}, generated)},
		{name: "a negative generation: random", password: secret(map[string]string{AnnotationCAKeyGeneration: "-1"}, generated)},
		{name: "a short password, annotated by hand: random", password: secret(map[string]string{AnnotationCAKeyGeneration: "0"}, "hunter2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := caKeySourceOf(b, tt.password)
			if got.derived() != tt.wantDerived || got.Generation != tt.wantGeneration {
				t.Fatalf("derived %v generation %d, want %v %d", got.derived(), got.Generation, tt.wantDerived, tt.wantGeneration)
			}
			if got.derived() && got.PasswordSecret != "main-repository" {
				t.Errorf("PasswordSecret = %q, want main-repository", got.PasswordSecret)
			}
		})
	}
}

func TestNewCA(t *testing.T) {
	now := time.Now()
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}}
	elsewhere := b.DeepCopy()
	elsewhere.Namespace = "other"
	derived := caKeySource{Secret: []byte(password.New()), PasswordSecret: "main-repository"}
	next := derived
	next.Generation = 1

	first, _, err := derived.newCA(b, now)
	if err != nil {
		t.Fatal(err)
	}
	pinned := string(first.CertPEM())
	lapsed, err := pki.NewCAWithKey(caCommonName(b), first.Key, -time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired := string(lapsed.CertPEM())
	otherKey, err := pki.NewCA(caCommonName(b), time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name        string
		source      caKeySource
		bsls        *v1alpha1.BackupStorageLocationServer
		pinned      string
		wantSameKey bool // as first's
		wantSamePin bool // first's certificate, kept
	}{
		{name: "derived again, nothing pinned: the same key in a new certificate", source: derived, bsls: b, wantSameKey: true},
		{name: "derived again while guests pin its certificate: that very certificate", source: derived, bsls: b, pinned: pinned, wantSameKey: true, wantSamePin: true},
		{name: "the pinned certificate has expired: a new one for the same key", source: derived, bsls: b, pinned: expired, wantSameKey: true},
		{name: "guests pin another key's CA: a new certificate of the derived key", source: derived, bsls: b, pinned: string(otherKey.CertPEM()), wantSameKey: true},
		{name: "the next generation (a replacement): another key", source: next, bsls: b, pinned: pinned},
		{name: "another BSLS given the same password: another key", source: derived, bsls: elsewhere},
		{name: "random: another key", source: caKeySource{}, bsls: b, pinned: pinned},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bsls := tt.bsls.DeepCopy()
			bsls.Status.TLSCA = tt.pinned
			ca, samePin, err := tt.source.newCA(bsls, now)
			if err != nil {
				t.Fatal(err)
			}
			if sameKey := ca.Key.Equal(first.Key); sameKey != tt.wantSameKey {
				t.Errorf("same key as the first CA: %v, want %v", sameKey, tt.wantSameKey)
			}
			if samePin != tt.wantSamePin || ca.Cert.Equal(first.Cert) != tt.wantSamePin {
				t.Errorf("samePin %v, same certificate %v; want %v", samePin, ca.Cert.Equal(first.Cert), tt.wantSamePin)
			}
			if _, err := pki.ParseCA(ca.CertPEM(), mustKeyPEM(t, ca)); err != nil {
				t.Errorf("the CA's certificate and key do not belong together: %v", err)
			}
		})
	}
}

func mustKeyPEM(t *testing.T, ca *pki.CA) []byte {
	t.Helper()
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return key
}
