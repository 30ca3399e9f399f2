package kopiaserver

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The rotation reads which guests run, and since when, from KubeVirt.
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch

// AnnotationRotateCA on Secret <bsls>-ca asks for an overlapped rotation of
// the BSLS's own CA (the controller's); its value is the admin's reason.
// Guests trust their CA and nothing else, and take a new one only when
// their VM starts, so the server cannot simply switch: it gives every
// guest the next CA beside the current one first (status.tlsCA, hence
// every VM's bootstrap), and switches once no VM runs a guest that booted
// without it. Removing the annotation before then calls the rotation off.
const AnnotationRotateCA = "guestbackup.io/rotate-ca"

// AnnotationCARotationStarted (controller) on Secret <bsls>-ca is when the
// rotation under way began (RFC 3339).
const AnnotationCARotationStarted = "guestbackup.io/ca-rotation-started"

// AnnotationCARotationSwitched (controller) on Secret <bsls>-ca marks a
// switch whose derived key generation is not raised yet
// (alignCAKeyGeneration).
const AnnotationCARotationSwitched = "guestbackup.io/ca-rotation-switched"

// Keys of Secret <bsls>-ca that hold the next CA while the CA rotates.
const (
	NextCACertKey = "next.crt"
	NextCAKeyKey  = "next.key"
)

// Event reasons of a CA rotation.
const (
	// ReasonCARotationStarted (Normal): guests are given the next CA.
	ReasonCARotationStarted = "CARotationStarted"
	// ReasonCARotated (Normal): the server switched to the next CA.
	ReasonCARotated = "CARotated"
	// ReasonCARotationCancelled (Normal): the annotation went before the
	// switch; the current CA stays.
	ReasonCARotationCancelled = "CARotationCancelled"
	// ReasonCARotationNotSupported (Warning): the annotation is on a CA the
	// controller does not issue (cert-manager's, or the admin's).
	ReasonCARotationNotSupported = "CARotationNotSupported"
)

// DefaultCARotationMinOverlap is how long guests are given the next CA at
// least before the server switches: a VM admitted by a webhook that read
// the BSLS before the rotation began gets a bootstrap without the next CA,
// and the controller's view must have caught up with it.
const DefaultCARotationMinOverlap = 2 * time.Minute

// DefaultCARotationClientOverlap is how long a rotation gives the
// workloads of BackupClients to restart with the next CA: nothing tells
// when they read their Secret.
const DefaultCARotationClientOverlap = 24 * time.Hour

// caRotationRecheck is how often a rotation that waits for guests looks at
// their instances again: the reconciler does not watch them.
const caRotationRecheck = 30 * time.Second

// maxWaitingVMs bounds status.caRotation.waitingVMs.
const maxWaitingVMs = 20

// caRotation is a rotation under way, as Secret <bsls>-ca holds it.
type caRotation struct {
	current, next *pki.CA
	reason        string
	started       time.Time
}

// bundle is what guests trust while the CA rotates: the current CA, then
// the next.
func (rot *caRotation) bundle() []byte { return pki.EncodeCerts(rot.current.Cert, rot.next.Cert) }

// rotationStep is what a pass does about a CA rotation.
type rotationStep int

const (
	rotationNone rotationStep = iota
	rotationStart
	rotationWait
	rotationSwitch
	rotationCancel
)

// decideRotation is the rotation's policy, given Secret <bsls>-ca's
// annotation (reason), whether it holds a next CA, the VMs whose guests do
// not trust it yet, when it began and the time now.
func decideRotation(reason string, hasNext bool, waiting int, started, now time.Time, minOverlap time.Duration) rotationStep {
	switch {
	case reason == "" && !hasNext:
		return rotationNone
	case reason == "":
		return rotationCancel
	case !hasNext:
		return rotationStart
	case waiting > 0 || now.Before(started.Add(minOverlap)):
		return rotationWait
	}
	return rotationSwitch
}

// guestTrustMargin is how much later than a bootstrap's render an
// instance must be created to count as one whose guest read it: the
// controller's clock, which stamps the render, and the kubelet's view of
// the Secret may trail the API server's.
const guestTrustMargin = 5 * time.Second

// guestWaits says whether the guest of the VM whose credential Secret is
// secret, running as instance vmi (nil: none), may not trust the CAs whose
// PEM sums to bundleSum (vmsecret.CASum): its bootstrap does not carry
// them yet, or its instance was created before the bootstrap did (plus
// guestTrustMargin). The kubelet reads the Secret for the instance's
// virt-launcher pod, which comes after the instance, so an instance
// created after the render read it; one created before may have read
// either, and counts as one that did not. A VM that runs no guest reads
// the bootstrap as it is at its next start.
func guestWaits(secret *corev1.Secret, vmi *kubevirtv1.VirtualMachineInstance, bundleSum string) (bool, string) {
	_, caSum := vmsecret.Rendered(secret)
	rendered, since := vmsecret.RenderedCAAt(secret)
	switch {
	case caSum != bundleSum || !since:
		return true, "its bootstrap does not carry the next CA yet"
	case vmi == nil || vmi.IsFinal():
		return false, "it reads its bootstrap at its next start"
	case vmi.CreationTimestamp.Time.Before(rendered.Add(guestTrustMargin)):
		return true, fmt.Sprintf("its instance was created at %s, before its bootstrap carried the next CA (%s): restart it", vmi.CreationTimestamp.UTC().Format(time.RFC3339), rendered.UTC().Format(time.RFC3339))
	}
	return false, "its instance was created after its bootstrap carried the next CA"
}

// rotationOf reads the rotation Secret ca holds; nil when none, or when ca
// holds no usable current or next CA.
func rotationOf(ca *corev1.Secret) *caRotation {
	if len(ca.Data[NextCACertKey]) == 0 {
		return nil
	}
	current, err := pki.ParseCA(ca.Data[corev1.TLSCertKey], ca.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil
	}
	next, err := pki.ParseCA(ca.Data[NextCACertKey], ca.Data[NextCAKeyKey])
	if err != nil {
		return nil
	}
	started, err := time.Parse(time.RFC3339, ca.Annotations[AnnotationCARotationStarted])
	if err != nil {
		started = time.Time{}
	}
	return &caRotation{current: current, next: next, reason: ca.Annotations[AnnotationRotateCA], started: started}
}

// clientWaits says whether the workload of a BackupClient whose Secret is
// secret may not trust the CAs of bundle yet: its Secret does not carry
// them, or the rotation, begun at started, has not lasted overlap by now.
// A workload reads its Secret when it starts, and nothing tells when that
// is, so it is given time to restart.
func clientWaits(secret *corev1.Secret, bundle []byte, started, now time.Time, overlap time.Duration) (bool, string) {
	switch until := started.Add(overlap); {
	case secret == nil || string(secret.Data[clientsecret.KeyCA]) != string(bundle):
		return true, "its Secret does not carry the next CA yet"
	case now.Before(until):
		return true, fmt.Sprintf("its workload reads the CA when it starts: restart it before %s", until.UTC().Format(time.RFC3339))
	}
	return false, "its Secret has carried the next CA for the clients' overlap"
}

// waitingFor lists the VMs of b whose guests may not trust rot's CAs yet
// (guestWaits), and its BackupClients whose workloads may not
// (clientWaits), namespace/name, sorted.
func (r *Reconciler) waitingFor(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, rot *caRotation) (vms, clients []string, err error) {
	server := client.ObjectKeyFromObject(b)
	secrets := &corev1.SecretList{}
	if err := r.Client.List(ctx, secrets, client.MatchingLabels(vmsecret.ServerLabels(server))); err != nil {
		return nil, nil, fmt.Errorf("list the credential Secrets of BackupStorageLocationServer %s: %w", b.Name, err)
	}
	bundle := rot.bundle()
	sum := vmsecret.CASum(bundle)
	for i := range secrets.Items {
		s := &secrets.Items[i]
		vm := vmsecret.VM(s)
		if !vmsecret.IsManaged(s) || !vmsecret.IsNamedFor(s) || !s.DeletionTimestamp.IsZero() {
			continue
		}
		vmi := &kubevirtv1.VirtualMachineInstance{}
		switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: vm}, vmi); {
		case client.IgnoreNotFound(err) != nil:
			return nil, nil, fmt.Errorf("get VirtualMachineInstance %s/%s: %w", s.Namespace, vm, err)
		case err != nil:
			vmi = nil
		}
		if waits, _ := guestWaits(s, vmi, sum); waits {
			vms = append(vms, s.Namespace+"/"+vm)
		}
	}
	named, clientSecrets, err := r.clientsOf(ctx, server)
	if err != nil {
		return nil, nil, err
	}
	allowed, err := r.allowedNamespaces(ctx, b)
	if err != nil {
		return nil, nil, err
	}
	now := r.Clock.Now()
	for i := range named {
		c := &named[i]
		if !mayUse(c, server, allowed) {
			// It has no user to lose: a client the server refuses,
			// which anyone may create in their namespace, holds no
			// rotation up.
			continue
		}
		s := clientSecrets[types.NamespacedName{Namespace: c.Namespace, Name: clientsecret.Name(c)}]
		if !clientsecret.IsOf(s, c) {
			s = nil
		}
		if waits, _ := clientWaits(s, bundle, rot.started, now, r.caRotationClientOverlap()); waits {
			clients = append(clients, c.Namespace+"/"+c.Name)
		}
	}
	slices.Sort(vms)
	slices.Sort(clients)
	return vms, clients, nil
}

// rotateCA carries out the rotation Secret ca (the controller's own CA,
// which exists) asks for, and returns the rotation that stands after this
// pass (nil when none) and the guests it waits for.
func (r *Reconciler) rotateCA(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, ca *corev1.Secret) (*caRotation, waitingList, error) {
	if !ca.DeletionTimestamp.IsZero() {
		return nil, waitingList{}, nil // the guard's to handle
	}
	if err := r.alignCAKeyGeneration(ctx, b, ca); err != nil {
		return nil, waitingList{}, err
	}
	if _, err := pki.ParseCA(ca.Data[corev1.TLSCertKey], ca.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return nil, waitingList{}, nil // TLSSecretInvalid says what is wrong with it
	}
	rot := rotationOf(ca)
	var waiting waitingList
	if rot != nil && rot.reason != "" {
		var err error
		if waiting.vms, waiting.clients, err = r.waitingFor(ctx, b, rot); err != nil {
			return nil, waiting, err
		}
	}
	now := r.Clock.Now()
	var started time.Time
	if rot != nil {
		started = rot.started
	}
	switch decideRotation(ca.Annotations[AnnotationRotateCA], rot != nil, waiting.count(), started, now, r.caRotationMinOverlap()) {
	case rotationNone:
		return nil, waitingList{}, nil
	case rotationWait:
		return rot, waiting, nil
	case rotationCancel:
		err := r.patchCA(ctx, ca, func(s *corev1.Secret) {
			delete(s.Data, NextCACertKey)
			delete(s.Data, NextCAKeyKey)
			delete(s.Annotations, AnnotationCARotationStarted)
		})
		if err != nil {
			return nil, waitingList{}, err
		}
		r.Recorder.Eventf(b, corev1.EventTypeNormal, ReasonCARotationCancelled,
			"The rotation of the CA was called off (annotation %s removed from Secret %s): the server keeps CA SHA-256 %s, and guests are given it alone again",
			AnnotationRotateCA, ca.Name, pki.Fingerprint(rot.current.Cert))
		return nil, waitingList{}, nil
	case rotationStart:
		rot, err := r.startCARotation(ctx, b, ca)
		if err != nil {
			return nil, waiting, err
		}
		waiting.vms, waiting.clients, err = r.waitingFor(ctx, b, rot)
		return rot, waiting, err
	}
	// rotationSwitch: the Secret first, then the derived key's generation
	// (alignCAKeyGeneration), which every pass puts right after a crash
	// between the two. Raised first, a switch that then failed (a
	// conflict, a crash) would have left a generation whose key the
	// server does not use, for as long as the rotation waited or if it
	// was called off.
	key, err := rot.next.KeyPEM()
	if err != nil {
		return nil, waitingList{}, err
	}
	err = r.patchCA(ctx, ca, func(s *corev1.Secret) {
		s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = rot.next.CertPEM(), key
		delete(s.Data, NextCACertKey)
		delete(s.Data, NextCAKeyKey)
		delete(s.Annotations, AnnotationCARotationStarted)
		delete(s.Annotations, AnnotationRotateCA)
		s.Annotations[AnnotationCARotationSwitched] = now.UTC().Format(time.RFC3339)
	})
	if err != nil {
		return nil, waitingList{}, err
	}
	if err := r.alignCAKeyGeneration(ctx, b, ca); err != nil {
		return nil, waitingList{}, err
	}
	r.Recorder.Eventf(b, corev1.EventTypeNormal, ReasonCARotated,
		"The server switches from CA SHA-256 %s to SHA-256 %s (%s): every guest that runs booted trusting both, given since %s; the server's certificate is issued again under the new CA",
		pki.Fingerprint(rot.current.Cert), pki.Fingerprint(rot.next.Cert), rot.reason, rot.started.UTC().Format(time.RFC3339))
	return nil, waitingList{}, nil
}

// startCARotation issues the next CA into Secret ca, beside the current
// one: with the key of the next generation when the current one's is
// derived from the repository password, else a random key.
func (r *Reconciler) startCARotation(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, ca *corev1.Secret) (*caRotation, error) {
	current, err := pki.ParseCA(ca.Data[corev1.TLSCertKey], ca.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("Secret %s: %w", ca.Name, err)
	}
	password, err := r.passwordSecret(ctx, b)
	if err != nil {
		return nil, err
	}
	keys := caKeySourceOf(b, password)
	derived, err := keys.isCurrentKey(b, ca)
	if err != nil {
		return nil, err
	}
	var next *pki.CA
	if derived {
		keys.Generation++
		key, err := keys.key(b)
		if err != nil {
			return nil, err
		}
		next, err = pki.NewCAWithKey(caCommonName(b), key, selfManagedCALifetime)
		if err != nil {
			return nil, err
		}
	} else if next, err = pki.NewCA(caCommonName(b), selfManagedCALifetime); err != nil {
		return nil, err
	}
	key, err := next.KeyPEM()
	if err != nil {
		return nil, err
	}
	now := r.Clock.Now().UTC()
	err = r.patchCA(ctx, ca, func(s *corev1.Secret) {
		s.Data[NextCACertKey], s.Data[NextCAKeyKey] = next.CertPEM(), key
		s.Annotations[AnnotationCARotationStarted] = now.Format(time.RFC3339)
	})
	if err != nil {
		return nil, err
	}
	rot := &caRotation{current: current, next: next, reason: ca.Annotations[AnnotationRotateCA], started: now.Truncate(time.Second)}
	r.Recorder.Eventf(b, corev1.EventTypeNormal, ReasonCARotationStarted,
		"Rotating the CA (%s): guests are given the next CA, SHA-256 %s, beside the current one, SHA-256 %s; the server switches once no VM runs a guest that booted without it (status.caRotation lists those waiting: restart them to finish sooner), at the earliest in %s",
		rot.reason, pki.Fingerprint(next.Cert), pki.Fingerprint(current.Cert), r.caRotationMinOverlap())
	return rot, nil
}

// refuseRotation says, on b, that the rotation annotated on its CA Secret
// is not carried out: cert-manager signs the server's certificates from
// that CA (whoever issued it), and would go on signing with the CA the
// Secret holds. The recorder folds the repeats of one Event into a count.
func (r *Reconciler) refuseRotation(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) error {
	ca, err := r.optionalSecret(ctx, types.NamespacedName{Namespace: b.Namespace, Name: CASecretName(b)})
	if err != nil || ca == nil || ca.Annotations[AnnotationRotateCA] == "" {
		return err
	}
	r.Recorder.Eventf(b, corev1.EventTypeWarning, ReasonCARotationNotSupported,
		"Secret %s is annotated %s, but cert-manager signs this server's certificates (Issuer %s): the controller rotates its CA only when it signs them itself. Replace the CA as docs/backupstoragelocationserver.md says (annotate %s, then delete the Secret), planning VM restarts, and remove %s",
		ca.Name, AnnotationRotateCA, CAIssuerName(b), AnnotationReplaceCA, AnnotationRotateCA)
	return nil
}

// alignCAKeyGeneration raises the generation on the repository password
// Secret when Secret ca holds the next generation's derived key: a
// rotation switched the Secret and did not get to raise it. A new cluster
// given the password then makes the key the server uses.
func (r *Reconciler) alignCAKeyGeneration(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, ca *corev1.Secret) error {
	if ca.Annotations[AnnotationCARotationSwitched] == "" {
		return nil
	}
	password, err := r.passwordSecret(ctx, b)
	if err != nil {
		return err
	}
	keys := caKeySourceOf(b, password)
	keys.Generation++
	ahead, err := keys.isCurrentKey(b, ca)
	if err != nil {
		return err
	}
	if ahead {
		patch := client.MergeFromWithOptions(password.DeepCopy(), client.MergeFromWithOptimisticLock{})
		password.Annotations[AnnotationCAKeyGeneration] = strconv.Itoa(keys.Generation)
		if err := r.Client.Patch(ctx, password, patch); err != nil {
			return fmt.Errorf("raise %s on Secret %s: %w", AnnotationCAKeyGeneration, password.Name, err)
		}
	}
	return r.patchCA(ctx, ca, func(s *corev1.Secret) { delete(s.Annotations, AnnotationCARotationSwitched) })
}

// patchCA changes Secret ca as change says, locked to the version read:
// a Secret changed since is decided again at the next pass.
func (r *Reconciler) patchCA(ctx context.Context, ca *corev1.Secret, change func(*corev1.Secret)) error {
	patch := client.MergeFromWithOptions(ca.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if ca.Annotations == nil {
		ca.Annotations = map[string]string{}
	}
	change(ca)
	if err := r.Client.Patch(ctx, ca, patch); err != nil {
		return fmt.Errorf("rotate the CA in Secret %s: %w", ca.Name, err)
	}
	return nil
}

func (r *Reconciler) caRotationClientOverlap() time.Duration {
	if r.CARotationClientOverlap > 0 {
		return r.CARotationClientOverlap
	}
	return DefaultCARotationClientOverlap
}

func (r *Reconciler) caRotationMinOverlap() time.Duration {
	if r.CARotationMinOverlap > 0 {
		return r.CARotationMinOverlap
	}
	return DefaultCARotationMinOverlap
}

// rotatedCAChange is CAChanged's message for the switch of a rotation
// begun at started.
func rotatedCAChange(before, after string, started metav1.Time) string {
	return fmt.Sprintf("The CA guests trust changed from SHA-256 %s to %s, as the rotation begun at %s planned: every running guest booted trusting both; every VM's bootstrap is rendered again with the new CA alone (BootstrapUpdated on each VM)",
		before, after, started.UTC().Format(time.RFC3339))
}

// waitingList is what a rotation waits for: VMs and BackupClients,
// namespace/name.
type waitingList struct {
	vms, clients []string
}

func (w waitingList) count() int { return len(w.vms) + len(w.clients) }

// rotationStatus is status.caRotation for rot, waiting for those named.
func rotationStatus(rot *caRotation, waiting waitingList) *v1alpha1.CARotationStatus {
	if rot == nil {
		return nil
	}
	return &v1alpha1.CARotationStatus{
		NextFingerprint: pki.Fingerprint(rot.next.Cert), Reason: rot.reason,
		StartTime: metav1.Time{Time: rot.started}, Waiting: int32(min(waiting.count(), 1<<30)), //nolint:gosec // bounded
		WaitingVMs:     firstOf(waiting.vms),
		WaitingClients: firstOf(waiting.clients),
	}
}

// firstOf is up to maxWaitingVMs of names, nil for none.
func firstOf(names []string) []string {
	if len(names) == 0 {
		return nil
	}
	return slices.Clone(names[:min(len(names), maxWaitingVMs)])
}
