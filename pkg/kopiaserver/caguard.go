package kopiaserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
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
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/optimistic"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// The CA guard deletes the rescue copy of a CA Secret once the Secret is
// back (the rule is granted for revocation too: pkg/credentials).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=delete

// FinalizerCAGuard is on Secret <bsls>-ca while its BSLS exists and has a
// CA of its own: a deletion then leaves the Secret readable (terminating)
// until the controller has re-created it with the same key pair. Guests
// trust that CA alone (docs/design.md, decisions 3 and 28), so a Secret lost to
// a namespace clean-up, a restore that skipped it or a mistake would
// otherwise cost every running guest its backups until its VM restarts.
//
// The same finalizer is on the BSLS while it guards its CA Secret: the
// BSLS's deletion, even one that happens while no controller runs, then
// waits for the controller to release the CA Secret, which would
// otherwise keep its finalizer with no controller to remove it (and hang
// the deletion of its namespace).
const FinalizerCAGuard = "guestbackup.io/ca-guard"

// AnnotationReplaceCA on Secret <bsls>-ca, set before deleting it, makes
// the deletion a deliberate replacement: the controller lets it through
// and a new CA is issued (docs/backupstoragelocationserver.md, "Replacing
// the CA"). Its value is the admin's reason, for the record. It arms one
// deletion: the new CA Secret does not carry it.
const AnnotationReplaceCA = "guestbackup.io/replace-ca"

// caRescueKey is the key of the rescue Secret that holds the deleted CA
// Secret, as JSON.
const caRescueKey = "secret"

// Annotations the controller writes on a rescue Secret, and only it: a
// rescue is trusted only with them (trustRescue).
const (
	// annotationCASourceUID is the UID of the CA Secret the rescue copies.
	annotationCASourceUID = "guestbackup.io/ca-source-uid"
	// annotationCAReleasedAt is when, by the controller's clock, it let
	// that Secret's deletion complete.
	annotationCAReleasedAt = "guestbackup.io/ca-released-at"
	// annotationCAWrittenAt is when, by the controller's clock, it last
	// let the CA Secret go or wrote it from the rescue.
	annotationCAWrittenAt = "guestbackup.io/ca-written-at"
	// annotationCARevision is the status.revision of the CA's cert-manager
	// Certificate at that moment ("" before its first issuance).
	annotationCARevision = "guestbackup.io/ca-certificate-revision"
)

// caGuardRetry is how soon a guard that waits (for the API server to
// finish a deletion, for cert-manager to settle) looks again.
const caGuardRetry = 2 * time.Second

// caBlockedRetry is how soon a guard that cannot keep a copy of the CA
// (a Secret it does not trust holds the rescue's name), or that waits for
// another party's finalizer on the CA Secret, looks again.
const caBlockedRetry = 30 * time.Second

// caSettle is how long, after the controller last let go or wrote a CA
// Secret that cert-manager issues, cert-manager must leave the Secret and
// its Certificate alone (no issuance, the same status.revision) before
// the restore is done. cert-manager saw the Secret gone: with no Secret it
// issues a CA with a new key (rotationPolicy Never reuses only the key of
// a Secret that exists), which it may write after the controller
// re-created the Secret; the rescued key pair is then put back over it.
const caSettle = 15 * time.Second

// caHoldLimit bounds that hold, from the release: a cert-manager that
// keeps writing the Secret for longer wins, and the controller says so
// (ReasonCARescueAbandoned; CAChanged follows if the CA changed).
const caHoldLimit = 5 * time.Minute

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
	// caRelease: remove FinalizerCAGuard, so that the deletion completes
	// (stamping the rescue, if any, with the moment).
	caRelease
	// caWait: the CA Secret is going, not by the guard's hand, or
	// cert-manager may still write it: look again.
	caWait
	// caRestore: write the rescued CA Secret back (create it, or, within
	// cert-manager's hold, put its key pair back into the Secret
	// cert-manager issued again meanwhile).
	caRestore
	// caRestored: the CA Secret holds the rescued key pair again: delete
	// the rescue Secret and say so.
	caRestored
	// caBlocked: the CA Secret is being deleted, but the rescue's name is
	// held by a Secret the controller does not trust: keep the CA Secret
	// (terminating, readable) and look again; the refusal is reported.
	caBlocked
	// caDiscard: the rescue is not needed (the deletion is a replacement,
	// it copies the live CA Secret and no deletion is under way, or it is
	// the controller's own copy of the Secret being deleted but not
	// trusted, a CA no guest trusts): delete it.
	caDiscard
	// caAbandon: the CA Secret was written with another key pair after the
	// release, and may not be written over (no cert-manager hold, or its
	// bound passed): delete the rescue and say so.
	caAbandon
	// caWaitOthers: the CA Secret, released by the guard, is kept
	// terminating by another party's finalizer, for as long as that
	// party takes: look again, but not as often as caWait
	// (caBlockedRetry).
	caWaitOthers
	// caLetGo: the CA Secret being deleted holds no CA guests trust (not a
	// matching certificate and key, no pin yet, or another CA than the
	// pin): no copy could ever be restored (trustRescue), so remove
	// FinalizerCAGuard without one, and say so.
	caLetGo
)

// caGuardInputs is what the CA guard decides from.
type caGuardInputs struct {
	// CA and Rescue are Secrets <bsls>-ca and <bsls>-ca-rescue (nil: absent).
	CA, Rescue *corev1.Secret
	// Pin is status.tlsFingerprint, the CA guests trust ("": none yet).
	Pin string
	// NextPin is status.caRotation.nextFingerprint while the CA rotates:
	// guests trust it too, and it is the Secret's own CA from the switch
	// until the status says so.
	NextPin string
	// OwnCopy: Rescue is a copy the controller made of the CA Secret being
	// deleted (ownRescue), trusted or not.
	OwnCopy bool
	// Restored is the CA Secret Rescue holds, when the controller trusts
	// it (trustRescue); nil otherwise.
	Restored *corev1.Secret
	// CertManager: cert-manager issues the CA Secret.
	CertManager bool
	// Hold: cert-manager may still write the CA Secret after the release
	// (certManagerHold).
	Hold bool
	// Expired: the hold's bound (caHoldLimit) has passed.
	Expired bool
}

// decideCAGuard decides the guard's next step from the CA Secret and the
// rescue Secret as they are now. Run until it settles, it takes a deleted
// CA Secret through rescue, release and restore, and every step is safe to
// repeat after a crash. A rescue it does not trust is never written
// anywhere: it is as if there were none, except that it holds the name a
// rescue needs.
//
// cert-manager sees the Secret gone between release and restore and
// issues the CA again, with a new key, and may write it before or after
// the restore. So, for a CA cert-manager issues, the rescued key pair is
// put back over whatever it wrote while it may still write (Hold), within
// caHoldLimit of the release; a live CA Secret is never written over
// otherwise.
func decideCAGuard(in caGuardInputs) caGuardAction {
	ca := in.CA
	guarded := ca != nil && controllerutil.ContainsFinalizer(ca, FinalizerCAGuard)
	terminating := ca != nil && !ca.DeletionTimestamp.IsZero()
	replace := ca != nil && ca.Annotations[AnnotationReplaceCA] != ""
	if in.Restored != nil {
		released := in.Rescue.Annotations[annotationCAReleasedAt] != ""
		switch {
		case terminating && replace:
			return caDiscard
		case terminating && guarded:
			return caRelease
		case terminating && len(ca.Finalizers) > 0:
			return caWaitOthers
		case terminating:
			return caWait
		case ca == nil:
			return caRestore
		case sameKeyPair(ca, in.Restored) && in.Hold:
			return caWait
		case sameKeyPair(ca, in.Restored) && released:
			return caRestored
		case sameKeyPair(ca, in.Restored):
			return caDiscard
		case released && in.CertManager && !in.Expired:
			return caRestore
		}
		return caAbandon
	}
	switch {
	case ca == nil || (terminating && !guarded):
		return caSettled
	case terminating && replace:
		return caRelease
	case terminating && in.OwnCopy:
		// The controller's own copy of this very Secret, not trusted
		// (a CA nobody trusts, copied by an earlier release): of no use,
		// and no reason to hold the deletion.
		return caDiscard
	case terminating && untrustedCA(ca, in.Pin, in.NextPin) != "":
		return caLetGo
	case terminating && in.Rescue != nil:
		return caBlocked
	case terminating:
		return caRescue
	case !guarded:
		return caGuard
	}
	return caSettled
}

// ownRescue reports whether rescue is a copy the controller made of the
// CA Secret ca while it is being deleted: guestbackup's labels (only
// guestbackup may write them) and ca's UID. Such a copy that is not
// trusted (trustRescue) copies a CA no guest trusts.
func ownRescue(b *v1alpha1.BackupStorageLocationServer, ca, rescue *corev1.Secret) bool {
	if ca == nil || rescue == nil || ca.DeletionTimestamp.IsZero() || rescue.Annotations[annotationCASourceUID] != string(ca.UID) {
		return false
	}
	for k, v := range Labels(b) {
		if rescue.Labels[k] != v {
			return false
		}
	}
	return true
}

// untrustedCA says why the CA Secret ca holds no CA guests trust, given
// their pin and the next CA of a rotation under way ("": they trust it):
// its certificate and key must match, and the certificate's SHA-256 must
// be the non-empty pin, or next. Not the parser's
// words beyond the standard library's error, which quotes no key.
func untrustedCA(ca *corev1.Secret, pin, next string) string {
	crt, key := ca.Data[corev1.TLSCertKey], ca.Data[corev1.TLSPrivateKeyKey]
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return fmt.Sprintf("its %s and %s are not a matching certificate and key (%v)", corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err)
	}
	if pin == "" {
		return "no CA is pinned yet (status.tlsFingerprint is empty): no guest trusts one"
	}
	if got := fingerprintOf(crt); got != pin && (next == "" || got != next) {
		return fmt.Sprintf("its CA (SHA-256 %s) is not the one guests trust (status.tlsFingerprint %s)", got, pin)
	}
	return ""
}

// sameKeyPair reports whether the CA Secret holds the rescued certificate
// and key.
func sameKeyPair(ca, restored *corev1.Secret) bool {
	return bytes.Equal(ca.Data[corev1.TLSCertKey], restored.Data[corev1.TLSCertKey]) &&
		bytes.Equal(ca.Data[corev1.TLSPrivateKeyKey], restored.Data[corev1.TLSPrivateKeyKey])
}

// rescueSecret is the rescue Secret of b's terminating CA Secret ca: its
// labels, annotations and data as JSON, so that the restored Secret is
// what cert-manager or the controller wrote, and the UID of ca. It
// carries guestbackup's labels, so only guestbackup may write it (the
// chart's admission policy).
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
			Annotations: map[string]string{
				AnnotationKeep:        "Secret " + ca.Name + " while it is re-created after its deletion; deleted then",
				annotationCASourceUID: string(ca.UID),
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{caRescueKey: raw},
	}, nil
}

// trustRescue returns the CA Secret of b that rescue holds, ready to
// create (guarded again), when rescue is one the controller made of the
// CA guests trust; else nil and why not. ca is Secret <bsls>-ca as it is
// now (nil: absent). Whoever may create a Secret in the namespace may
// create one by the rescue's name; none of what such a Secret says is
// taken on trust:
//   - guestbackup's labels (only guestbackup may write them) and the UID of
//     the CA Secret it copies, which must be the one being deleted;
//   - a certificate whose SHA-256 is status.tlsFingerprint, the pin
//     guests already hold, and the key of that certificate: only the
//     holder of that CA's key can meet both;
//   - the copy names Secret <bsls>-ca, and is restored as that Secret, of
//     type kubernetes.io/tls, without owners, whatever it says.
func trustRescue(b *v1alpha1.BackupStorageLocationServer, ca, rescue *corev1.Secret) (*corev1.Secret, string) {
	for k, v := range Labels(b) {
		if rescue.Labels[k] != v {
			return nil, fmt.Sprintf("it is not labelled as guestbackup's (%s=%s)", k, v)
		}
	}
	uid := rescue.Annotations[annotationCASourceUID]
	if uid == "" {
		return nil, "it names no CA Secret it copies (annotation " + annotationCASourceUID + ")"
	}
	saved := &corev1.Secret{}
	// Not the decoder's error: it may quote what the Secret holds.
	if json.Unmarshal(rescue.Data[caRescueKey], saved) != nil {
		return nil, fmt.Sprintf("its copy (key %s) is not a Secret in JSON", caRescueKey)
	}
	if saved.Name != CASecretName(b) || saved.Namespace != b.Namespace {
		return nil, fmt.Sprintf("it copies Secret %s/%s, not %s/%s", saved.Namespace, saved.Name, b.Namespace, CASecretName(b))
	}
	crt, key := saved.Data[corev1.TLSCertKey], saved.Data[corev1.TLSPrivateKeyKey]
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return nil, fmt.Sprintf("its %s and %s are not a matching certificate and key: %v", corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err)
	}
	pin := fingerprintOf(crt)
	if b.Status.TLSFingerprint == "" || pin != b.Status.TLSFingerprint {
		return nil, fmt.Sprintf("its CA (SHA-256 %s) is not the one guests trust (status.tlsFingerprint %q)", pin, b.Status.TLSFingerprint)
	}
	// A copy of another Secret than the one being deleted is of no use
	// unless it holds the same key pair (a restored Secret deleted again).
	if ca != nil && !ca.DeletionTimestamp.IsZero() && string(ca.UID) != uid && !sameKeyPair(ca, saved) {
		return nil, fmt.Sprintf("it copies the CA Secret with UID %s, not the one being deleted (UID %s)", uid, ca.UID)
	}
	annotations := maps.Clone(saved.Annotations)
	delete(annotations, AnnotationReplaceCA)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: CASecretName(b), Namespace: b.Namespace,
			Labels: saved.Labels, Annotations: annotations,
			Finalizers: []string{FinalizerCAGuard},
		},
		Type: corev1.SecretTypeTLS,
		Data: saved.Data,
	}, ""
}

// guardCA keeps b's own CA through a deletion of Secret <bsls>-ca that
// nobody marked as a replacement: it observes the CA and rescue Secrets,
// lets decideCAGuard pick a step, takes it, and observes again, until
// nothing is left to do. It returns how soon to look again (0: no need).
// A rescue it does not trust is reported, never an error.
func (r *Reconciler) guardCA(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (time.Duration, error) {
	// Whatever happens to the BSLS, the CA Secret is released first.
	if err := r.addFinalizer(ctx, b, FinalizerCAGuard); err != nil {
		return 0, err
	}
	caKey := types.NamespacedName{Namespace: b.Namespace, Name: CASecretName(b)}
	rescueKey := types.NamespacedName{Namespace: b.Namespace, Name: CARescueSecretName(b)}
	certManager := chooseTLS(b, r.CertManagerCA, r.CertManager) == tlsOwnCertManagerCA
	refused := map[string]string{}
	defer func() {
		server := client.ObjectKeyFromObject(b)
		for _, name := range r.rescueRefusals.news(r.Clock, server, refused) {
			log.FromContext(ctx).Info("CA rescue Secret ignored", "secret", b.Namespace+"/"+name, "why", refused[name])
			r.Recorder.Eventf(b, corev1.EventTypeWarning, ReasonCARescueIgnored,
				"Secret %s/%s is ignored: %s. It is never written into Secret %s; while it exists, a deletion of that Secret is held (the Secret stays readable) rather than let through without a copy: delete it (or, to replace the CA on purpose, annotate Secret %s %s before deleting it)",
				b.Namespace, name, refused[name], caKey.Name, caKey.Name, AnnotationReplaceCA)
		}
	}()
	// Each step changes what the next observation sees; a handful covers
	// the longest path (rescue, release, restore, restored, settled).
	for range 8 {
		ca, err := r.optionalSecret(ctx, caKey)
		if err != nil {
			return 0, err
		}
		in := caGuardInputs{CA: ca, Pin: b.Status.TLSFingerprint, CertManager: certManager}
		if rot := b.Status.CARotation; rot != nil {
			in.NextPin = rot.NextFingerprint
		}
		if in.Rescue, err = r.optionalSecret(ctx, rescueKey); err != nil {
			return 0, err
		}
		clear(refused)
		in.OwnCopy = ownRescue(b, ca, in.Rescue)
		if in.Rescue != nil {
			var why string
			if in.Restored, why = trustRescue(b, ca, in.Rescue); in.Restored == nil {
				refused[rescueKey.Name] = why
			}
		}
		revision, issuing, err := r.caCertificateState(ctx, b, certManager)
		if err != nil {
			return 0, err
		}
		if in.Restored != nil && certManager && in.Rescue.Annotations[annotationCAReleasedAt] != "" &&
			in.Rescue.Annotations[annotationCARevision] != revision {
			// cert-manager issued since the controller last looked: the
			// revision is stable from now on, or it settles again.
			if err := r.stampRescue(ctx, in.Rescue, revision, false); err != nil {
				return 0, err
			}
			continue
		}
		if in.Restored != nil {
			in.Hold, in.Expired = certManagerHold(r.Clock.Now(), in.Rescue, certManager, revision, issuing)
		}
		switch decideCAGuard(in) {
		case caSettled:
			return 0, nil
		case caWait:
			return caGuardRetry, nil
		case caBlocked, caWaitOthers:
			return caBlockedRetry, nil
		case caGuard:
			if err := r.setCAFinalizer(ctx, ca, true); err != nil {
				return 0, err
			}
		case caRelease:
			if ca.Annotations[AnnotationReplaceCA] != "" {
				// A replacement needs a new key: the CA issued next
				// must not be derived from the generation it replaces.
				if err := r.nextCAKeyGeneration(ctx, b, ca); err != nil {
					return 0, err
				}
			}
			if in.Restored != nil {
				if err := r.stampRescue(ctx, in.Rescue, revision, true); err != nil {
					return 0, err
				}
			}
			if err := r.setCAFinalizer(ctx, ca, false); err != nil {
				return 0, err
			}
		case caLetGo:
			if err := r.setCAFinalizer(ctx, ca, false); err != nil {
				return 0, err
			}
			r.Recorder.Eventf(b, corev1.EventTypeWarning, ReasonCASecretNotKept,
				"Secret %s/%s was deleted and is let go without a copy: %s. A CA is issued in its place: the one guests trust, made again, when its key is derived from the repository password (CASecretRemade), else a new one that guests refuse until their VM restarts (CAChanged). To replace the CA on purpose, annotate the Secret %s before deleting it",
				ca.Namespace, ca.Name, untrustedCA(ca, in.Pin, in.NextPin), AnnotationReplaceCA)
		case caRescue:
			s, err := rescueSecret(b, ca)
			if err != nil {
				return 0, err
			}
			if err := r.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
				return 0, fmt.Errorf("create Secret %s: %w", s.Name, err)
			}
		case caRestore:
			if err := r.stampRescue(ctx, in.Rescue, revision, false); err != nil {
				return 0, err
			}
			if err := r.restoreCA(ctx, ca, in.Restored); err != nil {
				return 0, err
			}
		case caDiscard:
			if _, err := r.deleteRescue(ctx, in.Rescue); err != nil {
				return 0, err
			}
			log.FromContext(ctx).Info("CA rescue Secret deleted: not needed", "secret", rescueKey.String())
		case caRestored:
			deleted, err := r.deleteRescue(ctx, in.Rescue)
			if err != nil {
				return 0, err
			}
			if deleted {
				r.Recorder.Eventf(b, corev1.EventTypeWarning, ReasonCASecretRestored,
					"Secret %s/%s was deleted; it is re-created with the same CA (SHA-256 %s), so running guests keep trusting the server. To replace the CA on purpose, annotate the Secret %s before deleting it%s",
					ca.Namespace, ca.Name, caFingerprint(ca), AnnotationReplaceCA, expiredNote(in.Expired))
			}
		case caAbandon:
			deleted, err := r.deleteRescue(ctx, in.Rescue)
			if err != nil {
				return 0, err
			}
			if deleted {
				r.Recorder.Eventf(b, corev1.EventTypeWarning, ReasonCARescueAbandoned,
					"Secret %s/%s was deleted and written again with another CA (SHA-256 %s) before the controller could restore the one guests trust (SHA-256 %s); it is left as it is%s",
					ca.Namespace, ca.Name, caFingerprint(ca), fingerprintOf(in.Restored.Data[corev1.TLSCertKey]), expiredNote(in.Expired))
			}
		}
	}
	return caGuardRetry, nil
}

// expiredNote completes a message when cert-manager's hold passed its bound.
func expiredNote(expired bool) string {
	if !expired {
		return ""
	}
	return fmt.Sprintf(" (cert-manager was still issuing the CA %v after the deletion; the controller no longer writes over it)", caHoldLimit)
}

// deleteRescue deletes the rescue Secret, as observed (its UID), and
// reports whether this call deleted it.
func (r *Reconciler) deleteRescue(ctx context.Context, rescue *corev1.Secret) (bool, error) {
	err := r.Client.Delete(ctx, rescue, client.Preconditions{UID: &rescue.UID})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return false, nil
	}
	return false, fmt.Errorf("delete Secret %s: %w", rescue.Name, err)
}

// stampRescue records on the rescue Secret, by the controller's clock,
// that the controller lets the CA Secret go (release) or writes it, and
// the CA Certificate's revision then: cert-manager's hold runs from there.
func (r *Reconciler) stampRescue(ctx context.Context, rescue *corev1.Secret, revision string, release bool) error {
	patch := client.MergeFrom(rescue.DeepCopy())
	now := r.Clock.Now().UTC().Format(time.RFC3339Nano)
	if release && rescue.Annotations[annotationCAReleasedAt] == "" {
		metav1.SetMetaDataAnnotation(&rescue.ObjectMeta, annotationCAReleasedAt, now)
	}
	metav1.SetMetaDataAnnotation(&rescue.ObjectMeta, annotationCAWrittenAt, now)
	metav1.SetMetaDataAnnotation(&rescue.ObjectMeta, annotationCARevision, revision)
	if err := r.Client.Patch(ctx, rescue, patch); err != nil {
		return fmt.Errorf("stamp Secret %s: %w", rescue.Name, err)
	}
	return nil
}

// restoreCA writes the rescued CA Secret back: created when it is gone,
// else (cert-manager issued it again the moment it was gone) its key pair
// and cert-manager's annotations put back. decideCAGuard allows the
// latter only within cert-manager's hold.
func (r *Reconciler) restoreCA(ctx context.Context, ca, restored *corev1.Secret) error {
	if ca == nil {
		if err := r.Client.Create(ctx, restored); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("re-create Secret %s: %w", restored.Name, err)
		}
		return nil
	}
	err := optimistic.Patch(ctx, r.Client, ca, func() {
		if ca.Data == nil {
			ca.Data = map[string][]byte{}
		}
		for k, v := range restored.Data {
			ca.Data[k] = v
		}
		for k, v := range restored.Annotations {
			metav1.SetMetaDataAnnotation(&ca.ObjectMeta, k, v)
		}
		controllerutil.AddFinalizer(ca, FinalizerCAGuard)
	})
	if err := optimistic.IgnoreConflict(err); err != nil {
		return fmt.Errorf("put the CA back into Secret %s: %w", ca.Name, err)
	}
	return nil
}

// setCAFinalizer adds or removes FinalizerCAGuard on the CA Secret ca.
// A merge patch, guarded by ca's resourceVersion: the finalizers list is
// replaced as a whole, so another writer's finalizer added meanwhile must
// not be lost.
func (r *Reconciler) setCAFinalizer(ctx context.Context, ca *corev1.Secret, on bool) error {
	err := optimistic.Patch(ctx, r.Client, ca, func() {
		if on {
			controllerutil.AddFinalizer(ca, FinalizerCAGuard)
		} else {
			controllerutil.RemoveFinalizer(ca, FinalizerCAGuard)
		}
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("set finalizer %s on Secret %s (%t): %w", FinalizerCAGuard, ca.Name, on, err)
	}
	return nil
}

// releaseCA removes FinalizerCAGuard from the CA Secret of BSLS server,
// which is gone, going, or no longer has a CA of its own: the Secret
// outlives its BSLS (AnnotationKeep), but no controller would then finish
// its deletion. The rescue Secret goes (dropRescue): no guard is left to
// restore from it or delete it.
func (r *Reconciler) releaseCA(ctx context.Context, server types.NamespacedName) error {
	if err := r.dropRescue(ctx, server); err != nil {
		return err
	}
	name := CASecretName(&v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: server.Name}})
	ca, err := r.optionalSecret(ctx, types.NamespacedName{Namespace: server.Namespace, Name: name})
	if err != nil || ca == nil || !controllerutil.ContainsFinalizer(ca, FinalizerCAGuard) {
		return err
	}
	return r.setCAFinalizer(ctx, ca, false)
}

// dropRescue deletes Secret <bsls>-ca-rescue of BSLS server, which is
// gone, going, or no longer has a CA of its own, if the controller made
// it (guestbackup's labels, which only guestbackup may write): a restore
// the BSLS's deletion interrupted would otherwise leave that copy of the
// CA key behind for good. A Secret of another party by that name is not
// the controller's to delete.
func (r *Reconciler) dropRescue(ctx context.Context, server types.NamespacedName) error {
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: server.Name, Namespace: server.Namespace}}
	rescue, err := r.optionalSecret(ctx, types.NamespacedName{Namespace: server.Namespace, Name: CARescueSecretName(b)})
	if err != nil || rescue == nil {
		return err
	}
	for k, v := range Labels(b) {
		if rescue.Labels[k] != v {
			return nil
		}
	}
	deleted, err := r.deleteRescue(ctx, rescue)
	if deleted {
		log.FromContext(ctx).Info("CA rescue Secret deleted: its BackupStorageLocationServer no longer guards its CA", "secret", server.Namespace+"/"+rescue.Name)
	}
	return err
}

// releaseOrphanedCAs removes FinalizerCAGuard from every CA Secret whose
// BSLS no longer exists, and deletes the controller's rescue Secrets of
// such a BSLS (dropRescue): one deleted while no controller ran, before
// BSLSs carried FinalizerCAGuard themselves (or whose finalizer was
// removed by hand), never reaches the reconciler again. It reads around
// the cache (cert-manager's CA Secrets are not in it) and runs once as
// the controller starts.
func (r *Reconciler) releaseOrphanedCAs(ctx context.Context) error {
	secrets := &corev1.SecretList{}
	if err := r.APIReader.List(ctx, secrets, client.HasLabels{LabelBSLS}); err != nil {
		return fmt.Errorf("list the Secrets labelled %s: %w", LabelBSLS, err)
	}
	for i := range secrets.Items {
		s := &secrets.Items[i]
		server := types.NamespacedName{Namespace: s.Namespace, Name: s.Labels[LabelBSLS]}
		guarded := controllerutil.ContainsFinalizer(s, FinalizerCAGuard) && s.Name == server.Name+"-ca"
		rescue := s.Name == server.Name+"-ca-rescue"
		if !guarded && !rescue {
			continue
		}
		switch err := r.APIReader.Get(ctx, server, &v1alpha1.BackupStorageLocationServer{}); {
		case apierrors.IsNotFound(err) && rescue:
			if err := r.dropRescue(ctx, server); err != nil {
				return err
			}
		case apierrors.IsNotFound(err):
			log.FromContext(ctx).Info("releasing the CA Secret of a BackupStorageLocationServer that no longer exists", "secret", s.Namespace+"/"+s.Name)
			if err := r.setCAFinalizer(ctx, s, false); err != nil {
				return err
			}
		case err != nil:
			return fmt.Errorf("get BackupStorageLocationServer %s: %w", server, err)
		}
	}
	return nil
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
	return fingerprintOf(s.Data[corev1.TLSCertKey])
}

// fingerprintOf is the SHA-256 of the first certificate of PEM data
// ("unreadable" when there is none).
func fingerprintOf(certPEM []byte) string {
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		return "unreadable"
	}
	return pki.Fingerprint(certs[0])
}

// guardOwnCA runs the CA guard when b has a CA of its own (the
// controller's or cert-manager's, in Secret <bsls>-ca). An admin's Secret
// or issuer is the admin's to keep: a guard left from an earlier own CA is
// removed, so that the admin may delete that Secret, and the BSLS's
// finalizer with it.
func (r *Reconciler) guardOwnCA(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (time.Duration, error) {
	switch chooseTLS(b, r.CertManagerCA, r.CertManager) {
	case tlsOwnControllerCA, tlsOwnCertManagerCA:
		return r.guardCA(ctx, b)
	}
	return 0, r.finalizeWith(ctx, b, FinalizerCAGuard, func() error { return r.releaseCA(ctx, client.ObjectKeyFromObject(b)) })
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

// caCertificateState is the status.revision ("" before the first
// issuance) of the cert-manager Certificate of b's own CA, and whether it
// is issuing, read around the cache (which may not show either yet).
// Nothing when cert-manager does not issue b's CA.
func (r *Reconciler) caCertificateState(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, certManager bool) (revision string, issuing bool, err error) {
	if !certManager {
		return "", false, nil
	}
	crt := &certmanagerv1.Certificate{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: CACertificateName(b)}, crt); err != nil {
		if apierrors.IsNotFound(err) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("get Certificate %s: %w", CACertificateName(b), err)
	}
	if crt.Status.Revision != nil {
		revision = strconv.Itoa(*crt.Status.Revision)
	}
	for _, c := range crt.Status.Conditions {
		if c.Type == certmanagerv1.CertificateConditionIssuing && c.Status == cmmeta.ConditionTrue {
			issuing = true
		}
	}
	return revision, issuing, nil
}

// certManagerHold says whether cert-manager may still write the CA Secret
// the controller let go of (hold), and whether that hold's bound has
// passed (expired), at now by the controller's clock. It holds only for a
// CA cert-manager issues, after a release stamped on the rescue, until
// caHoldLimit after it, and while the CA Certificate is issuing, its
// status.revision is not the one stamped at the controller's last write,
// or that write is younger than caSettle. An unreadable stamp (the
// controller writes it, but the Secret is the namespace's) counts as
// a bound passed.
func certManagerHold(now time.Time, rescue *corev1.Secret, certManager bool, revision string, issuing bool) (hold, expired bool) {
	if !certManager {
		return false, false
	}
	released, err := time.Parse(time.RFC3339Nano, rescue.Annotations[annotationCAReleasedAt])
	if err != nil {
		return false, true
	}
	if now.Sub(released) > caHoldLimit {
		return false, true
	}
	written, err := time.Parse(time.RFC3339Nano, rescue.Annotations[annotationCAWrittenAt])
	if err != nil {
		return false, false
	}
	return issuing || revision != rescue.Annotations[annotationCARevision] || now.Sub(written) < caSettle, false
}
