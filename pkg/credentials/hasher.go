// Package credentials reconciles the per-VM credential Secrets the webhook
// writes (pkg/vmsecret states that contract): the controller's side of that
// contract.
package credentials

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/optimistic"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The hasher reads credential Secrets from the cache and patches in the
// hash; it reads the VMs' instances to tell when a rotation reached the guest.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// It reads the BSLS a Secret names for the hash algorithm it asks for.
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers,verbs=get;list;watch

// Reasons of the Events the Hasher records on a VirtualMachine.
const (
	// ReasonRotationPending: the server keeps accepting the previous
	// password until the guest restarts with the new one.
	ReasonRotationPending = "RotationPending"
	// ReasonRotationForced: the grace period ended while the guest still
	// ran with the previous password, which the server no longer accepts.
	ReasonRotationForced = "RotationForced"
)

// DefaultRotationGrace is how long, at most, the server keeps accepting a
// rotated-out password while the VM's guest still runs with it.
const DefaultRotationGrace = 24 * time.Hour

// Hasher hashes each per-VM password once per generation, the way Kopia
// stores it, and keeps the hash in the Secret: the BSLS's user sync reads
// hashes only, so a resync never hashes again (hashing is slow by design).
//
// A rotation reaches a guest only when it starts again: KubeVirt builds the
// guest's cloud-init disk (or secret disk) from the Secret as the instance's
// launcher pod starts (see LauncherStarted). So when a guest whose launcher
// started before the rotation still runs, the Hasher keeps the previous
// generation's hash as the one the server accepts (HashFor) until that
// instance stops (the VM stopped or restarted: its next launcher reads the
// new password) or RotationGrace has passed, and says so on the VM.
type Hasher struct {
	Client client.Client
	// APIReader reads around the cache; default (SetupWithManager): the
	// manager's. A BSLS the cache does not hold yet is looked up there
	// before a Secret of it is hashed by the default algorithm.
	APIReader client.Reader
	// Version is the hashing algorithm for a Secret whose BSLS does not
	// exist (yet); default scrypt, Kopia's default. A BSLS's
	// spec.access.passwordHash decides for its own users.
	Version identity.HashVersion
	// Recorder records Events on VMs; default: the manager's.
	Recorder record.EventRecorder
	// RotationGrace bounds how long a previous password stays valid while
	// the guest has not restarted; default DefaultRotationGrace.
	RotationGrace time.Duration
	// Clock tells the time; default (SetupWithManager): the real clock.
	Clock clock.PassiveClock
}

// SetupWithManager registers the Hasher; hashes run in parallel, one per core.
// It watches the VMs' instances, their creation, deletion and phase changes,
// so that a restarted or stopped guest ends a rotation at once.
func (h *Hasher) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	if h.Clock == nil {
		h.Clock = clock.RealClock{}
	}
	if h.Recorder == nil {
		h.Recorder = mgr.GetEventRecorderFor(eventSource)
	}
	if h.APIReader == nil {
		h.APIReader = mgr.GetAPIReader()
	}
	sel := vmsecret.Selector()
	return ctrl.NewControllerManagedBy(mgr).
		Named("credential-hasher").
		For(&corev1.Secret{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return sel.Matches(labels.Set(o.GetLabels()))
		}))).
		// An instance's creation, deletion and phase are all that matter:
		// its other, frequent status updates pass none.
		Watches(&kubevirtv1.VirtualMachineInstance{}, handler.EnqueueRequestsFromMapFunc(secretOfInstance),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: phaseChanged})).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(concurrency, 1)}).
		Complete(h)
}

// secretOfInstance maps an instance to its VM's Secret: a VM's instance
// bears the VM's name.
func secretOfInstance(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: vmsecret.Name(o.GetName())}}}
}

// phaseChanged passes the updates of an instance that change its phase.
func phaseChanged(e event.UpdateEvent) bool {
	o, ok1 := e.ObjectOld.(*kubevirtv1.VirtualMachineInstance)
	n, ok2 := e.ObjectNew.(*kubevirtv1.VirtualMachineInstance)
	return !ok1 || !ok2 || o.Status.Phase != n.Status.Phase
}

// Reconcile hashes one Secret's password when its hash is missing or stale,
// and ends a rotation's grace once the guest has the new password.
func (h *Hasher) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	secret := &corev1.Secret{}
	if err := h.Client.Get(ctx, req.NamespacedName, secret); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !vmsecret.Selector().Matches(labels.Set(secret.Labels)) {
		// Reached from an instance: a Secret of that name that is not
		// guestbackup's is never touched.
		return ctrl.Result{}, nil
	}
	hashed := CurrentHash(secret) != nil
	_, recorded := vmsecret.PreviousHash(secret)
	previous, rotating := previousOnSameServer(secret)
	staleHash, staleGeneration, stale := staleOnSameServer(secret)
	if hashed && !rotating && !recorded {
		return ctrl.Result{}, nil
	}
	var keep Keep
	if rotating || stale {
		// Only a rotation asks whether the guest restarted since.
		instance, err := h.instance(ctx, secret)
		if err != nil {
			return ctrl.Result{}, err
		}
		grace := h.RotationGrace
		if grace <= 0 {
			grace = DefaultRotationGrace
		}
		keep = KeepPrevious(GraceStart(secret), instance, h.Clock.Now(), grace)
	}

	var change, event func()
	switch {
	case !hashed:
		password := vmsecret.Password(secret)
		if password == "" {
			// The webhook always writes one; nothing to hash until it does.
			log.FromContext(ctx).Info("credential Secret has no password", "secret", req.NamespacedName)
			return ctrl.Result{}, nil
		}
		version, err := h.hashVersion(ctx, secret)
		if err != nil {
			return ctrl.Result{}, err
		}
		hash, err := identity.NewHash(password, version)
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("hash password of %s: %w", req.NamespacedName, err)
		}
		ObserveHash(version)
		if keep.Keep && rotating {
			// Rotated again before the guest restarted: it still has the
			// password kept for it, not the one in between.
			staleGeneration = previous.Generation
		}
		change = func() {
			vmsecret.SetPasswordHash(secret, hash.String())
			switch {
			case !keep.Keep:
				vmsecret.SetPreviousHash(secret, nil)
			case rotating:
				// The previous hash stays: the one kept for the guest.
			case stale:
				vmsecret.SetPreviousHash(secret, &vmsecret.Previous{
					Hash: staleHash, Generation: staleGeneration, Server: vmsecret.Server(secret).String(), Since: vmsecret.IssuedAt(secret),
				})
			}
		}
		if keep.Keep {
			event = func() {
				h.record(secret, corev1.EventTypeNormal, ReasonRotationPending,
					"Credentials generation %s is ready; the server keeps accepting generation %s's password until the guest restarts with the new one (%s), at the latest until %s: restart the VM to revoke it now",
					vmsecret.Generation(secret), staleGeneration, keep.Why, keep.Until.UTC().Format(time.RFC3339))
			}
		}
	case !keep.Keep:
		change = func() { vmsecret.SetPreviousHash(secret, nil) }
		if keep.Forced {
			event = func() {
				h.record(secret, corev1.EventTypeWarning, ReasonRotationForced,
					"Generation %s's password no longer authenticates although the guest has not restarted since the rotation (%s): restart the VM so that its guest gets generation %s",
					previous.Generation, keep.Why, vmsecret.Generation(secret))
			}
		}
	default:
		return ctrl.Result{RequeueAfter: keep.Until.Sub(h.Clock.Now())}, nil
	}
	// The patch carries the resourceVersion: a password rotated since the
	// read makes it conflict instead of storing a stale hash.
	if err := optimistic.Patch(ctx, h.Client, secret, change); err != nil {
		return ctrl.Result{}, fmt.Errorf("store password hash of %s: %w", req.NamespacedName, err)
	}
	if event != nil {
		event()
	}
	if _, kept := vmsecret.PreviousHash(secret); kept {
		return ctrl.Result{RequeueAfter: keep.Until.Sub(h.Clock.Now())}, nil
	}
	return ctrl.Result{}, nil
}

// hashVersion is the algorithm the BSLS the Secret names asks for, or the
// Hasher's default when that BSLS does not exist: Kopia verifies every hash
// by its own version, so a hash of either kind authenticates wherever the
// user is provisioned. A hash is never made again, so a BSLS the cache
// has not seen yet (created with its VMs, as GitOps does) is looked up
// around it: its VMs would otherwise keep the default algorithm for good,
// where the admin asked for another (PBKDF2, for FIPS).
func (h *Hasher) hashVersion(ctx context.Context, secret *corev1.Secret) (identity.HashVersion, error) {
	fallback := h.Version
	if fallback == 0 {
		fallback = identity.Scrypt
	}
	b := &v1alpha1.BackupStorageLocationServer{}
	err := h.Client.Get(ctx, vmsecret.Server(secret), b)
	if apierrors.IsNotFound(err) && h.APIReader != nil {
		err = h.APIReader.Get(ctx, vmsecret.Server(secret), b)
	}
	switch {
	case apierrors.IsNotFound(err):
		return fallback, nil
	case err != nil:
		return 0, fmt.Errorf("get BackupStorageLocationServer %s: %w", vmsecret.Server(secret), err)
	}
	return HashVersionOf(b.Spec.Access.PasswordHash, fallback), nil
}

// HashVersionOf is the Kopia hash version of a BSLS's password hash choice;
// fallback when it names none.
func HashVersionOf(choice v1alpha1.PasswordHash, fallback identity.HashVersion) identity.HashVersion {
	switch choice {
	case v1alpha1.PasswordHashScrypt:
		return identity.Scrypt
	case v1alpha1.PasswordHashPBKDF2:
		return identity.PBKDF2
	default:
		return fallback
	}
}

// instance reads the instance of the Secret's VM; nil when the VM runs none.
func (h *Hasher) instance(ctx context.Context, secret *corev1.Secret) (*kubevirtv1.VirtualMachineInstance, error) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	key := types.NamespacedName{Namespace: secret.Namespace, Name: vmsecret.VM(secret)}
	if err := h.Client.Get(ctx, key, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil //nolint:nilnil // a VM that runs no instance is a state KeepPrevious decides on
		}
		return nil, fmt.Errorf("get VirtualMachineInstance %s: %w", key, err)
	}
	return vmi, nil
}

// record records an Event on the VM that controls secret, if any.
func (h *Hasher) record(secret *corev1.Secret, eventType, reason, format string, args ...any) {
	c := vmsecret.Controller(secret)
	if h.Recorder == nil || c == nil || !vmsecret.IsVMReference(*c) {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name, Namespace: secret.Namespace, UID: c.UID}
	h.Recorder.Eventf(ref, eventType, reason, format, args...)
}

// Keep is whether the server keeps accepting the previous generation's
// password, and why.
type Keep struct {
	Keep bool
	// Forced: the grace period ended while the guest still ran with the
	// previous password.
	Forced bool
	// Until is the end of the grace period.
	Until time.Time
	// Why, in words fit for an Event.
	Why string
}

// KeepPrevious decides whether the server keeps accepting the password of
// the generation before the one issued at issued, given the VM's instance
// (nil: none) at time now. Only a guest whose launcher started before the
// rotation (LauncherStarted) still has the previous password; a VM that runs
// no guest, or whose instance has not started its launcher yet, reads the
// new one when it does. Phase transition times have a resolution of a
// second, so a launcher started in the rotation's second counts as one that
// has the new password.
func KeepPrevious(issued time.Time, instance *kubevirtv1.VirtualMachineInstance, now time.Time, grace time.Duration) Keep {
	until := issued.Add(grace)
	started, ok := LauncherStarted(instance)
	at := started.UTC().Format(time.RFC3339)
	switch {
	case instance == nil:
		return Keep{Until: until, Why: "the VM runs no instance: its next start reads the new credentials"}
	case instance.IsFinal():
		return Keep{Until: until, Why: fmt.Sprintf("its instance is %s: the VM's next start reads the new credentials", instance.Status.Phase)}
	case !ok:
		return Keep{Until: until, Why: "its instance's launcher pod has not started yet: it reads the new credentials when it does"}
	case !started.Before(issued.Truncate(time.Second)):
		return Keep{Until: until, Why: fmt.Sprintf("its instance's launcher pod started at %s, after the rotation", at)}
	case !now.Before(until):
		return Keep{Forced: true, Until: until, Why: fmt.Sprintf("its instance's launcher pod started at %s; the grace period of %s ended", at, grace)}
	}
	return Keep{Keep: true, Until: until, Why: fmt.Sprintf("its instance's launcher pod started at %s, before the rotation", at)}
}

// LauncherStarted returns when the launcher pod of vmi started, as KubeVirt
// records it, and false while it has not (or vmi is nil): from then on the
// guest has the credentials the Secret held at that moment, until its next
// start. Where KubeVirt v1.8.1 reads the Secret:
//
//   - virt-controller renders a cloudInitNoCloud (or configDrive) volume's
//     secretRef as a Secret volume of the virt-launcher pod mounted with a
//     subPath (pkg/virt-controller/services/rendervolumes.go,
//     handleCloudInitNoCloud), and a secret volume (guestbackup's disk mode)
//     as a whole Secret volume (addSecretVolumeMount). The kubelet fetches
//     the Secret when it sets up the pod's volumes and binds a subPath file
//     when it creates the container; it never updates a subPath mount.
//   - virt-launcher reads those files once, when virt-handler first syncs
//     the instance: its preStartHook (pkg/virt-launcher/virtwrap/manager.go)
//     builds the NoCloud seed from them (pkg/cloud-init,
//     ReadCloudInitVolumeDataSource with config.SecretSourceDir) and the
//     secret disks (pkg/config, CreateSecretDisks).
//   - virt-handler syncs only a Scheduled instance, and virt-controller
//     moves an instance from Scheduling to Scheduled once the launcher
//     pod's compute container runs (pkg/virt-controller/watch/vmi,
//     lifecycle.go, controller.IsPodReady), recording the time in
//     status.phaseTransitionTimestamps (controller.SetVMIPhaseTransitionTimestamp).
//
// So an instance that is Pending or Scheduling (its pod waits for a node,
// an image, a volume) has not taken the Secret yet, and the transition to
// Scheduled is the latest time KubeVirt records before it did. A rotation
// in the moment between the compute container's start and virt-controller
// seeing it is the one window this cannot tell. An instance past Scheduling
// without that record (written by another KubeVirt, or migrated in) counts
// as started at its creation.
func LauncherStarted(vmi *kubevirtv1.VirtualMachineInstance) (time.Time, bool) {
	if vmi == nil || vmi.IsUnprocessed() || vmi.IsScheduling() {
		return time.Time{}, false
	}
	for _, t := range vmi.Status.PhaseTransitionTimestamps {
		if t.Phase == kubevirtv1.Scheduled {
			return t.PhaseTransitionTimestamp.Time, true
		}
	}
	return vmi.CreationTimestamp.Time, true
}

// HashFor returns the hash the server accepts for a credential Secret's
// user, nil when there is none yet: the previous generation's while a
// rotation waits for the guest to restart (or while the new password is
// being hashed), else the current generation's.
func HashFor(secret *corev1.Secret) *identity.Hash {
	if p, ok := previousOnSameServer(secret); ok {
		return parseHash(p.Hash)
	}
	if text, _, ok := staleOnSameServer(secret); ok {
		return parseHash(text)
	}
	return CurrentHash(secret)
}

// GraceStart is when the grace period of a rotation began: the rotation
// that first made the kept password stale. A rotation while one is kept
// keeps the guest's password, never extending how long it is accepted.
func GraceStart(secret *corev1.Secret) time.Time {
	if p, ok := previousOnSameServer(secret); ok && !p.Since.IsZero() {
		return p.Since
	}
	return vmsecret.IssuedAt(secret)
}

// previousOnSameServer is vmsecret.PreviousHash when the kept hash was
// provisioned on the server the Secret names now: a VM that moved to another
// server (the webhook keeps the controller's keys when it rewrites the
// Secret) takes no rotated-out password there.
func previousOnSameServer(secret *corev1.Secret) (vmsecret.Previous, bool) {
	p, ok := vmsecret.PreviousHash(secret)
	if !ok || p.Server != vmsecret.Server(secret).String() {
		return vmsecret.Previous{}, false
	}
	return p, true
}

// staleOnSameServer is vmsecret.StaleHash when the hash was provisioned on
// the server the Secret names now: a rotation. New credentials for another
// server (the VM moved) keep nothing of the old server's user.
func staleOnSameServer(secret *corev1.Secret) (hash, generation string, ok bool) {
	hash, generation, ok = vmsecret.StaleHash(secret)
	if server, _ := vmsecret.Announced(secret); !ok || server != vmsecret.Server(secret).String() {
		return "", "", false
	}
	return hash, generation, true
}

// CurrentHash returns the hash of the current generation's password, nil
// when the Hasher has not computed it yet.
func CurrentHash(secret *corev1.Secret) *identity.Hash {
	text, ok := vmsecret.PasswordHash(secret)
	if !ok {
		return nil
	}
	return parseHash(text)
}

func parseHash(text string) *identity.Hash {
	h, err := identity.ParseHash(text)
	if err != nil {
		return nil
	}
	return &h
}
