package kopiaserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// The CA guard deletes the rescue copy of a CA Secret once the Secret is
// back (the rule is granted for revocation too: pkg/credentials).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=delete

// FinalizerCAGuard is on Secret <bsls>-ca while its BSLS exists and has a
// CA of its own: a deletion then leaves the Secret readable (terminating)
// until the controller has re-created it with the same key pair. Guests
// trust that CA alone (DESIGN.md decisions 3 and 28), so a Secret lost to
// a namespace clean-up, a restore that skipped it or a mistake would
// otherwise cost every running guest its backups until its VM restarts.
const FinalizerCAGuard = "guestbackup.io/ca-guard"

// AnnotationReplaceCA on Secret <bsls>-ca, set before deleting it, makes
// the deletion a deliberate replacement: the controller lets it through
// and a new CA is issued (docs/backupstoragelocationserver.md, "Replacing
// the CA"). Its value is the admin's reason, for the record.
const AnnotationReplaceCA = "guestbackup.io/replace-ca"

// caRescueKey is the key of the rescue Secret that holds the deleted CA
// Secret, as JSON.
const caRescueKey = "secret"

// caGuardRetry is how soon a guard that waits (for the API server to
// finish a deletion, for cert-manager to settle) looks again.
const caGuardRetry = 2 * time.Second

// caSettle is how long a CA Secret that cert-manager writes is watched
// after its restore: cert-manager saw it gone for a moment and may start
// issuing the CA again (with the same key, but a new certificate) a
// little later; the rescued certificate is put back over it meanwhile.
const caSettle = 15 * time.Second

// CARescueSecretName holds a copy of Secret <bsls>-ca between the moment
// the controller lets a deleted one go and the moment it is re-created:
// should the controller stop in between, the next one re-creates it from
// there. It exists only for that moment.
func CARescueSecretName(b *v1alpha1.BackupStorageLocationServer) string {
	return b.Name + "-ca-rescue"
}

// caGuardAction is what the CA guard does next.
type caGuardAction int

const (
	// caSettled: nothing to do.
	caSettled caGuardAction = iota
	// caGuard: put FinalizerCAGuard on the CA Secret.
	caGuard
	// caRescue: copy the terminating CA Secret into the rescue Secret.
	caRescue
	// caRelease: remove FinalizerCAGuard, so that the deletion completes.
	caRelease
	// caWait: the CA Secret is going, not by the guard's hand: look again.
	caWait
	// caRestore: write the rescued CA Secret back (create, or put its key
	// pair back into a Secret another writer re-created meanwhile).
	caRestore
	// caRestored: the CA Secret holds the rescued key pair again: delete
	// the rescue Secret and say so.
	caRestored
)

// decideCAGuard decides the guard's next step from the CA Secret and the
// rescue Secret as they are now (nil: absent), and whether cert-manager
// may still write the CA Secret (hold). Run until it settles, it takes a
// deleted CA Secret through rescue, release and restore, and every step
// is safe to repeat after a crash.
//
// cert-manager sees the Secret gone for the moment between release and
// restore, and starts issuing a CA again (with the same key: the CA
// Certificate never rotates it) that it writes once done. So the rescue
// is kept, and the rescued certificate put back, while cert-manager is
// issuing and for caSettle after the restore: guests keep the very CA
// certificate they were given.
func decideCAGuard(ca, rescue *corev1.Secret, hold bool) caGuardAction {
	guarded := ca != nil && controllerutil.ContainsFinalizer(ca, FinalizerCAGuard)
	terminating := ca != nil && !ca.DeletionTimestamp.IsZero()
	if rescue != nil {
		switch {
		case terminating && guarded:
			return caRelease
		case terminating:
			return caWait
		case ca == nil || !sameKeyPair(ca, rescue):
			return caRestore
		case hold:
			return caWait
		}
		return caRestored
	}
	switch {
	case ca == nil || (terminating && !guarded):
		return caSettled
	case terminating && ca.Annotations[AnnotationReplaceCA] != "":
		return caRelease
	case terminating:
		return caRescue
	case !guarded:
		return caGuard
	}
	return caSettled
}

// sameKeyPair reports whether the CA Secret holds the rescued certificate
// and key.
func sameKeyPair(ca, rescue *corev1.Secret) bool {
	saved, err := rescuedSecret(rescue)
	if err != nil {
		return false
	}
	return bytes.Equal(ca.Data[corev1.TLSCertKey], saved.Data[corev1.TLSCertKey]) &&
		bytes.Equal(ca.Data[corev1.TLSPrivateKeyKey], saved.Data[corev1.TLSPrivateKeyKey])
}

// rescueSecret is the rescue Secret of b's terminating CA Secret ca: its
// type, labels, annotations and data as JSON, so that the restored Secret
// is what cert-manager or the controller wrote. It carries guestbackup's
// labels, so only guestbackup may write it (the chart's admission policy).
func rescueSecret(b *v1alpha1.BackupStorageLocationServer, ca *corev1.Secret) (*corev1.Secret, error) {
	saved := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: ca.Name, Namespace: ca.Namespace, Labels: ca.Labels, Annotations: ca.Annotations},
		Type:       ca.Type,
		Data:       ca.Data,
	}
	raw, err := json.Marshal(saved)
	if err != nil {
		return nil, fmt.Errorf("encode Secret %s: %w", ca.Name, err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: CARescueSecretName(b), Namespace: b.Namespace, Labels: Labels(b),
			Annotations: map[string]string{AnnotationKeep: "Secret " + ca.Name + " while it is re-created after its deletion; deleted then"},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{caRescueKey: raw},
	}, nil
}

// rescuedSecret is the CA Secret a rescue Secret holds, ready to create:
// guarded again.
func rescuedSecret(rescue *corev1.Secret) (*corev1.Secret, error) {
	saved := &corev1.Secret{}
	if err := json.Unmarshal(rescue.Data[caRescueKey], saved); err != nil {
		return nil, fmt.Errorf("decode the CA Secret that Secret %s holds: %w", rescue.Name, err)
	}
	if len(saved.Data[corev1.TLSCertKey]) == 0 || len(saved.Data[corev1.TLSPrivateKeyKey]) == 0 {
		return nil, fmt.Errorf("Secret %s holds no CA certificate and key", rescue.Name)
	}
	saved.Finalizers = []string{FinalizerCAGuard}
	return saved, nil
}

// guardCA keeps b's own CA through a deletion of Secret <bsls>-ca that
// nobody marked as a replacement: it observes the CA and rescue Secrets,
// lets decideCAGuard pick a step, takes it, and observes again, until
// nothing is left to do. It returns how soon to look again (0: no need).
func (r *Reconciler) guardCA(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (time.Duration, error) {
	caKey := types.NamespacedName{Namespace: b.Namespace, Name: CASecretName(b)}
	rescueKey := types.NamespacedName{Namespace: b.Namespace, Name: CARescueSecretName(b)}
	// Each step changes what the next observation sees; a handful covers
	// the longest path (rescue, release, restore, restored, settled).
	for range 8 {
		ca, err := r.optionalSecret(ctx, caKey)
		if err != nil {
			return 0, err
		}
		rescue, err := r.optionalSecret(ctx, rescueKey)
		if err != nil {
			return 0, err
		}
		hold, err := r.certManagerMayWrite(ctx, b, rescue)
		if err != nil {
			return 0, err
		}
		switch decideCAGuard(ca, rescue, hold) {
		case caSettled:
			return 0, nil
		case caWait:
			return caGuardRetry, nil
		case caGuard:
			if err := r.setCAFinalizer(ctx, ca, true); err != nil {
				return 0, err
			}
		case caRelease:
			if err := r.setCAFinalizer(ctx, ca, false); err != nil {
				return 0, err
			}
		case caRescue:
			s, err := rescueSecret(b, ca)
			if err != nil {
				return 0, err
			}
			if err := r.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
				return 0, fmt.Errorf("create Secret %s: %w", s.Name, err)
			}
		case caRestore:
			if err := r.restoreCA(ctx, ca, rescue); err != nil {
				return 0, err
			}
		case caRestored:
			if err := r.Client.Delete(ctx, rescue); err != nil && !apierrors.IsNotFound(err) {
				return 0, fmt.Errorf("delete Secret %s: %w", rescue.Name, err)
			}
			r.Recorder.Eventf(b, corev1.EventTypeWarning, ReasonCASecretRestored,
				"Secret %s/%s was deleted; it is re-created with the same CA (SHA-256 %s), so running guests keep trusting the server. To replace the CA on purpose, annotate the Secret %s before deleting it",
				ca.Namespace, ca.Name, caFingerprint(ca), AnnotationReplaceCA)
		}
	}
	return caGuardRetry, nil
}

// restoreCA writes the rescued CA Secret back: created when it is gone,
// else (cert-manager re-issued it the moment it was gone) its key pair
// and cert-manager's annotations put back, which cert-manager then keeps
// (the CA Certificate never rotates its key).
func (r *Reconciler) restoreCA(ctx context.Context, ca, rescue *corev1.Secret) error {
	saved, err := rescuedSecret(rescue)
	if err != nil {
		return err
	}
	if ca == nil {
		if err := r.Client.Create(ctx, saved); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("re-create Secret %s: %w", saved.Name, err)
		}
		return nil
	}
	patch := client.MergeFrom(ca.DeepCopy())
	if ca.Data == nil {
		ca.Data = map[string][]byte{}
	}
	for k, v := range saved.Data {
		ca.Data[k] = v
	}
	for k, v := range saved.Annotations {
		metav1.SetMetaDataAnnotation(&ca.ObjectMeta, k, v)
	}
	controllerutil.AddFinalizer(ca, FinalizerCAGuard)
	if err := r.Client.Patch(ctx, ca, patch); err != nil {
		return fmt.Errorf("put the CA back into Secret %s: %w", ca.Name, err)
	}
	return nil
}

// setCAFinalizer adds or removes FinalizerCAGuard on the CA Secret ca.
// A merge patch, guarded by ca's resourceVersion: the finalizers list is
// replaced as a whole, so another writer's finalizer added meanwhile must
// not be lost.
func (r *Reconciler) setCAFinalizer(ctx context.Context, ca *corev1.Secret, on bool) error {
	patch := client.MergeFromWithOptions(ca.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if on {
		controllerutil.AddFinalizer(ca, FinalizerCAGuard)
	} else {
		controllerutil.RemoveFinalizer(ca, FinalizerCAGuard)
	}
	if err := r.Client.Patch(ctx, ca, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("set finalizer %s on Secret %s (%t): %w", FinalizerCAGuard, ca.Name, on, err)
	}
	return nil
}

// releaseCA removes FinalizerCAGuard from the CA Secret of BSLS server,
// which is gone or going: the Secret outlives its BSLS (AnnotationKeep),
// but no controller would then finish its deletion.
func (r *Reconciler) releaseCA(ctx context.Context, server types.NamespacedName) error {
	ca, err := r.optionalSecret(ctx, types.NamespacedName{Namespace: server.Namespace, Name: server.Name + "-ca"})
	if err != nil || ca == nil || !controllerutil.ContainsFinalizer(ca, FinalizerCAGuard) {
		return err
	}
	return r.setCAFinalizer(ctx, ca, false)
}

// optionalSecret reads a Secret around the cache (the CA Secret
// cert-manager writes is not in it): nil when it does not exist.
func (r *Reconciler) optionalSecret(ctx context.Context, key types.NamespacedName) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get Secret %s: %w", key, err)
	}
	return s, nil
}

// caFingerprint is the SHA-256 of a CA Secret's certificate, as
// status.tlsFingerprint shows it ("unreadable" when it cannot be parsed).
func caFingerprint(s *corev1.Secret) string {
	certs, err := certutil.ParseCertsPEM(s.Data[corev1.TLSCertKey])
	if err != nil {
		return "unreadable"
	}
	return pki.Fingerprint(certs[0])
}

// guardOwnCA runs the CA guard when b has a CA of its own (the
// controller's or cert-manager's, in Secret <bsls>-ca). An admin's Secret
// or issuer is the admin's to keep: a guard left from an earlier own CA is
// removed, so that the admin may delete that Secret.
func (r *Reconciler) guardOwnCA(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (time.Duration, error) {
	switch chooseTLS(b, r.CertManagerCA, r.CertManager) {
	case tlsOwnControllerCA, tlsOwnCertManagerCA:
		return r.guardCA(ctx, b)
	}
	return 0, r.releaseCA(ctx, client.ObjectKeyFromObject(b))
}

// caChange says whether the CA guests are given changed from the pin
// before to the pin after (none before: a first CA, no change) and, if
// so, what that costs the running guests.
func caChange(before, after, source string) (string, bool) {
	if before == "" || before == after {
		return "", false
	}
	return fmt.Sprintf("The CA guests trust changed from SHA-256 %s to %s (now from %s): running guests refuse the server until their VM restarts; every VM's bootstrap is rendered again with the new CA (BootstrapUpdated on each VM)", before, after, source), true
}

// certManagerMayWrite reports whether cert-manager may still write b's CA
// Secret after its restore from rescue: it writes the Secret of a BSLS
// whose own CA it issues, and may while its CA Certificate is Issuing or
// the restore is younger than caSettle. The Certificate is read around
// the cache, which may not show the Issuing condition yet.
func (r *Reconciler) certManagerMayWrite(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, rescue *corev1.Secret) (bool, error) {
	if rescue == nil || chooseTLS(b, r.CertManagerCA, r.CertManager) != tlsOwnCertManagerCA {
		return false, nil
	}
	if r.Clock.Since(rescue.CreationTimestamp.Time) < caSettle {
		return true, nil
	}
	crt := &certmanagerv1.Certificate{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: CACertificateName(b)}, crt); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	for _, c := range crt.Status.Conditions {
		if c.Type == certmanagerv1.CertificateConditionIssuing && c.Status == cmmeta.ConditionTrue {
			return true, nil
		}
	}
	return false, nil
}
