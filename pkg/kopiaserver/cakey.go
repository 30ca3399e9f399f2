package kopiaserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// AnnotationCAKeyGeneration on the repository password Secret says that
// the key of the BSLS's own CA (the controller's, not cert-manager's) is
// derived from that password, and which generation of it is current. The
// controller writes it, "0", on the password it generates, and raises it
// when the admin replaces the CA on purpose.
//
// Why: guests trust their CA and nothing else, and a CA Secret lost beyond
// the guard (a new cluster given the password Secret but not the CA's, an
// etcd restore) used to mean a new key that every running guest refused
// until its VM restarted. The repository password is what an admin must
// keep anyway, since without it the backups are unreadable; a key derived
// from it is made again by any cluster given that Secret, and guests keep
// trusting the server. The password already opens every backup, so the
// key is no easier to take than the data it guards. A password a person
// chose gets a random key instead: the CA's public key would let anyone who
// reaches the server test guesses of a weak password offline.
const AnnotationCAKeyGeneration = "guestbackup.io/ca-key-generation"

// caKeySource is where the key of a CA the controller issues comes from.
type caKeySource struct {
	// Secret is the repository password the key is derived from; nil for a
	// random key.
	Secret []byte
	// PasswordSecret names the Secret that holds it, for messages.
	PasswordSecret string
	// Generation is the derivation's current generation.
	Generation int
}

// caKeySourceOf decides where a new CA's key comes from, given the
// repository password Secret (nil when absent): derived from the password
// when the controller generated it (it carries AnnotationCAKeyGeneration,
// a whole number), random otherwise.
func caKeySourceOf(b *v1alpha1.BackupStorageLocationServer, password *corev1.Secret) caKeySource {
	if password == nil {
		return caKeySource{}
	}
	value, ok := password.Annotations[AnnotationCAKeyGeneration]
	generation, err := strconv.Atoi(value)
	secret := password.Data[RepositoryPassword(b).Key]
	if !ok || err != nil || generation < 0 || len(secret) < 16 {
		return caKeySource{}
	}
	return caKeySource{Secret: secret, PasswordSecret: password.Name, Generation: generation}
}

// derived reports whether the key is derived rather than random.
func (s caKeySource) derived() bool { return s.Secret != nil }

// key derives the CA key of the source's generation. The BSLS's namespace
// and name are part of it, so two BSLSs given one password still get a CA
// each.
func (s caKeySource) key(b *v1alpha1.BackupStorageLocationServer) (*ecdsa.PrivateKey, error) {
	return pki.DeriveCAKey(s.Secret, fmt.Sprintf("%s/%s#%d", b.Namespace, b.Name, s.Generation))
}

// caCommonName is the name of the CA the controller issues for b.
func caCommonName(b *v1alpha1.BackupStorageLocationServer) string {
	return b.Namespace + "/" + b.Name + " guestbackup CA"
}

// newCA issues a CA for b. A derived key whose certificate guests already
// pin (b's status.tlsCA, a CA certificate of that very key, still valid)
// keeps that certificate, so the pin does not change either; any
// other gets a new certificate, whose leaves a guest still verifies against
// the certificate it holds for the same key.
func (s caKeySource) newCA(b *v1alpha1.BackupStorageLocationServer, now time.Time) (ca *pki.CA, samePin bool, err error) {
	if !s.derived() {
		ca, err = pki.NewCA(caCommonName(b), selfManagedCALifetime)
		return ca, false, err
	}
	key, err := s.key(b)
	if err != nil {
		return nil, false, err
	}
	if cert := pinnedCA(b.Status.TLSCA); cert != nil && key.PublicKey.Equal(cert.PublicKey) && now.Before(cert.NotAfter) {
		return &pki.CA{Cert: cert, Key: key}, true, nil
	}
	ca, err = pki.NewCAWithKey(caCommonName(b), key, selfManagedCALifetime)
	return ca, false, err
}

// pinnedCA parses status.tlsCA: the CA certificate guests pin, or nil.
// While the CA rotates, status.tlsCA holds the next CA after it.
func pinnedCA(pemData string) *x509.Certificate {
	certs, err := certutil.ParseCertsPEM([]byte(pemData))
	if err != nil || len(certs) == 0 || len(certs) > 2 || !certs[0].IsCA {
		return nil
	}
	return certs[0]
}

// isCurrentKey reports whether the CA Secret ca holds the key of the
// source's current generation.
func (s caKeySource) isCurrentKey(b *v1alpha1.BackupStorageLocationServer, ca *corev1.Secret) (bool, error) {
	if !s.derived() || ca == nil {
		return false, nil
	}
	held, err := pki.ParseCA(ca.Data[corev1.TLSCertKey], ca.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return false, nil // not a CA at all: not the derived one
	}
	current, err := s.key(b)
	if err != nil {
		return false, err
	}
	return current.Equal(held.Key), nil
}

// passwordSecret reads the repository password Secret of b, nil when it
// does not exist.
func (r *Reconciler) passwordSecret(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*corev1.Secret, error) {
	return r.optionalSecret(ctx, types.NamespacedName{Namespace: b.Namespace, Name: RepositoryPassword(b).Name})
}

// nextCAKeyGeneration raises the generation on the password Secret before a
// deliberate replacement of the CA in Secret ca is let through, so that the
// CA issued next has a new key. It does so only while ca holds the current
// generation's key: repeated after a crash, it raises nothing twice.
func (r *Reconciler) nextCAKeyGeneration(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, ca *corev1.Secret) error {
	password, err := r.passwordSecret(ctx, b)
	if err != nil {
		return err
	}
	source := caKeySourceOf(b, password)
	current, err := source.isCurrentKey(b, ca)
	if err != nil || !current {
		return err
	}
	patch := client.MergeFromWithOptions(password.DeepCopy(), client.MergeFromWithOptimisticLock{})
	password.Annotations[AnnotationCAKeyGeneration] = strconv.Itoa(source.Generation + 1)
	if err := r.Client.Patch(ctx, password, patch); err != nil {
		return fmt.Errorf("raise %s on Secret %s: %w", AnnotationCAKeyGeneration, password.Name, err)
	}
	return nil
}
