package credentials

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/optimistic"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The VM reconciler reads VMs, deletes the credential Secrets of VMs that
// are gone or opted out, and audits through Events on the VM.
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reasons of the Events the VM reconciler records on a VirtualMachine.
const (
	// ReasonUserProvisioned: the VM's user is in its server's users for the
	// first time.
	ReasonUserProvisioned = "UserProvisioned"
	// ReasonCredentialsRotated: the server's users hold the hash of a new
	// credentials generation in place of the one announced before.
	ReasonCredentialsRotated = "CredentialsRotated"
	// ReasonUserRevoked: the controller deleted the VM's credential Secret,
	// so the server drops its user.
	ReasonUserRevoked = "UserRevoked"
	// ReasonSecretInUse: the VM's credential Secret is due for deletion,
	// but a volume of the VM still reads it, so it is kept.
	ReasonSecretInUse = "SecretInUse"
)

const (
	// DefaultOrphanGrace is how long a credential Secret whose VM never
	// appeared is kept: the webhook writes it during admission, and the
	// VM is stored only once every later admission step has passed.
	DefaultOrphanGrace = 10 * time.Minute
	// DefaultSettleTime is how long after its last write a credential
	// Secret is never deleted; see VMReconciler.SettleTime.
	DefaultSettleTime = 30 * time.Second

	// eventSource is the component named by the Events; the BSLS
	// reconciler's Events name the same one.
	eventSource = "guestbackup-controller"
	// retryConflict is how soon a write that lost a race is retried; the
	// winner's write usually triggers a reconcile before that.
	retryConflict = time.Second
)

// VMReconciler is the controller's side of the per-VM credential Secret
// (docs/design.md, decisions 8 and 9). Keyed by the VM's namespace and name, it
// adopts the Secret once the VM is stored (the webhook writes the Secret at
// admission, before the VM has a UID), deletes it when the VM is deleted or
// opts out (the BSLS reconciler then drops the user), deletes Secrets whose
// VM never appeared, and records on the VM when its user is provisioned,
// rotated or revoked. It never blocks: whatever must wait is requeued.
type VMReconciler struct {
	Client client.Client
	// APIReader reads around the cache. A Secret is deleted only after the
	// API server itself confirms the VM's state, because a cache that has
	// not yet seen a new or changed VM would otherwise delete credentials
	// the VM is about to use. Default: the manager's API reader.
	APIReader client.Reader
	// Recorder records the Events on VMs. Default: the manager's.
	Recorder record.EventRecorder
	// OrphanGrace is how long a Secret whose VM never appeared is kept;
	// default DefaultOrphanGrace.
	OrphanGrace time.Duration
	// SettleTime is how long after its last write a Secret is never
	// deleted; default DefaultSettleTime. The webhook writes the Secret
	// before the API server stores the VM it admitted (switching servers,
	// re-creating a VM), so for a moment the Secret can disagree with the
	// stored VM while nothing is wrong.
	SettleTime time.Duration
	// Clock tells the time; default (SetupWithManager): the real clock.
	Clock clock.PassiveClock
}

func (r *VMReconciler) timing() timing {
	t := timing{orphanGrace: r.OrphanGrace, settle: r.SettleTime}
	if t.orphanGrace <= 0 {
		t.orphanGrace = DefaultOrphanGrace
	}
	if t.settle <= 0 {
		t.settle = DefaultSettleTime
	}
	return t
}

// SetupWithManager registers the reconciler. It watches VirtualMachines,
// the credential Secrets (mapped to their VM by the guestbackup.io/vm label)
// and the users Secrets (mapped to the VMs whose provisioning is not yet
// announced), so that every announcement follows the write that makes it
// true rather than a poll.
func (r *VMReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	useManager(mgr, &r.Client, &r.APIReader, &r.Recorder)
	return ctrl.NewControllerManagedBy(mgr).
		Named("vm-credentials").
		// Metadata is all a decision needs: caching whole VMs (specs, and
		// statuses that change as they run) would cost memory and decoding
		// for nothing.
		For(&kubevirtv1.VirtualMachine{}, builder.OnlyMetadata, builder.WithPredicates(vmChanged())).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(vmOfSecret), credentialSecrets()).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.vmsOfUsersSecret),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return o.GetLabels()[userset.Label] != ""
			}))).
		Complete(r)
}

// vmChanged passes the VM events that can change a decision: creation,
// deletion, the opt-in annotation, the start of a deletion and a spec
// change (which may free a Secret a volume read). A running
// VM's frequent status updates pass none.
func vmChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		oldVM, newVM := e.ObjectOld, e.ObjectNew
		return oldVM.GetAnnotations()[v1alpha1.AnnotationServer] != newVM.GetAnnotations()[v1alpha1.AnnotationServer] ||
			// A spec change may stop a volume reading the Secret.
			oldVM.GetGeneration() != newVM.GetGeneration() ||
			oldVM.GetDeletionTimestamp().IsZero() != newVM.GetDeletionTimestamp().IsZero() ||
			oldVM.GetUID() != newVM.GetUID()
	}}
}

// useManager fills in what a VM reconciler left unset with the manager's
// client, API reader and Event recorder.
func useManager(mgr ctrl.Manager, c *client.Client, reader *client.Reader, recorder *record.EventRecorder) {
	if *c == nil {
		*c = mgr.GetClient()
	}
	if *reader == nil {
		*reader = mgr.GetAPIReader()
	}
	if *recorder == nil {
		*recorder = mgr.GetEventRecorderFor(eventSource)
	}
}

// credentialSecrets passes the events of credential Secrets only.
func credentialSecrets() builder.WatchesOption {
	creds := vmsecret.Selector()
	return builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
		return creds.Matches(labels.Set(o.GetLabels()))
	}))
}

// getCredentialSecret reads the credential Secret of VM vm; nil when there
// is none.
func getCredentialSecret(ctx context.Context, c client.Reader, vm types.NamespacedName) (*corev1.Secret, error) {
	key := types.NamespacedName{Namespace: vm.Namespace, Name: vmsecret.Name(vm.Name)}
	secret := &corev1.Secret{}
	if err := c.Get(ctx, key, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil //nolint:nilnil // a VM without credentials is a state, not an error
		}
		return nil, fmt.Errorf("get credential Secret %s: %w", key, err)
	}
	return secret, nil
}

func vmOfSecret(_ context.Context, o client.Object) []reconcile.Request {
	vm := o.GetLabels()[vmsecret.LabelVM]
	if vm == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: vm}}}
}

// vmsOfUsersSecret maps a users Secret to the VMs whose user it holds and
// whose current generation is not announced yet: only those can gain an
// Event from its change, and a resync of a large server stays cheap.
func (r *VMReconciler) vmsOfUsersSecret(ctx context.Context, o client.Object) []reconcile.Request {
	bsls := o.GetLabels()[userset.Label]
	if bsls == "" {
		return nil
	}
	list := &corev1.SecretList{}
	server := types.NamespacedName{Namespace: o.GetNamespace(), Name: bsls}
	if err := r.Client.List(ctx, list, client.MatchingLabels(vmsecret.ServerLabels(server))); err != nil {
		log.FromContext(ctx).Error(err, "list the credential Secrets of a users Secret", "usersSecret", client.ObjectKeyFromObject(o))
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		s := &list.Items[i]
		vm := vmsecret.VM(s)
		if vm == "" || announcedOf(s).covers(vmsecret.Server(s), vmsecret.Generation(s)) {
			continue
		}
		if userset.SecretName(bsls, userset.ShardOf(vmsecret.Identity(s))) != o.GetName() {
			continue
		}
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: vm}})
	}
	return reqs
}

// Reconcile brings one VM's credential Secret in line with the VM.
func (r *VMReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	secret, err := getCredentialSecret(ctx, r.Client, req.NamespacedName)
	if err != nil || secret == nil {
		return ctrl.Result{}, err // none: the VM has no credentials, nothing to do
	}
	secretKey := client.ObjectKeyFromObject(secret)
	vm, err := getVM(ctx, r.Client, req.NamespacedName)
	if err != nil {
		return ctrl.Result{}, err
	}
	a := decide(vm, secret, r.Clock.Now(), r.timing())
	logger := log.FromContext(ctx).WithValues("secret", secretKey)
	switch a.verdict {
	case leave:
		return ctrl.Result{}, nil
	case wait:
		logger.V(1).Info("credential Secret kept for now", "pending", a.pending, "why", a.why, "recheckIn", a.after)
		return ctrl.Result{RequeueAfter: a.after}, nil
	case adopt:
		if err := r.adopt(ctx, vm, secret); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: retryConflict}, nil
			}
			return ctrl.Result{}, err
		}
		logger.Info("adopted credential Secret", "virtualMachine", vm.Name, "uid", vm.UID)
		return r.announceIssued(ctx, vm, secret)
	case keep:
		return r.announceIssued(ctx, vm, secret)
	case revoke, collect:
		return r.remove(ctx, req.NamespacedName, secret, a)
	}
	return ctrl.Result{}, fmt.Errorf("credential Secret %s: unknown verdict %s", secretKey, a.verdict)
}

// getVM reads a VM's metadata, the way the reconciler watches VMs; nil when
// there is no such VM.
func getVM(ctx context.Context, c client.Reader, key types.NamespacedName) (*metav1.PartialObjectMetadata, error) {
	vm := &metav1.PartialObjectMetadata{}
	vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	if err := c.Get(ctx, key, vm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil //nolint:nilnil // an absent VM is a state decide handles, not an error
		}
		return nil, fmt.Errorf("get VirtualMachine %s: %w", key, err)
	}
	// Events name the VM by its kind: keep it whatever the reader did.
	vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	return vm, nil
}

// adopt makes vm the Secret's controller, replacing the reference to a VM
// of the same name that was deleted and re-created. The controller
// reference is the fact the BSLS reconciler provisions the user from (the
// user of the VM that controls the Secret); it does not block the VM's
// deletion, and lets a real cluster's garbage collector delete the Secret
// too, though deleting it is this reconciler's job.
func (r *VMReconciler) adopt(ctx context.Context, vm *metav1.PartialObjectMetadata, secret *corev1.Secret) error {
	// Optimistic lock: a merge patch replaces the whole list, so it must
	// apply to the list it was computed from.
	err := optimistic.Patch(ctx, r.Client, secret, func() {
		refs := slices.DeleteFunc(slices.Clone(secret.OwnerReferences), vmsecret.IsVMReference)
		secret.OwnerReferences = append(refs, vmsecret.OwnerReference(vm.Name, vm.UID))
	})
	if err != nil {
		return fmt.Errorf("adopt Secret %s/%s for VirtualMachine %s: %w", secret.Namespace, secret.Name, vm.Name, err)
	}
	return nil
}

// announceIssued records the CredentialsIssued Event the webhook decided
// at the VM's creation, now that the VM has a UID (kubectl describe shows
// only Events with it), then announces the provisioning.
func (r *VMReconciler) announceIssued(ctx context.Context, vm *metav1.PartialObjectMetadata, secret *corev1.Secret) (ctrl.Result, error) {
	if msg := vmsecret.IssuedEvent(secret); msg != "" {
		// Removed before it is recorded: should the Event then be lost
		// with the process, that costs one Event, while the other order
		// would repeat it.
		if err := optimistic.Patch(ctx, r.Client, secret, func() { delete(secret.Annotations, vmsecret.AnnotationIssuedEvent) }); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: retryConflict}, nil
			}
			return ctrl.Result{}, fmt.Errorf("record the issued credentials of Secret %s/%s: %w", secret.Namespace, secret.Name, err)
		}
		r.Recorder.Event(vm, corev1.EventTypeNormal, vmevent.ReasonCredentialsIssued, msg)
	}
	return r.announce(ctx, vm, secret)
}

// announce records on the VM that its user is provisioned (or rotated) once
// the users Secret of its shard holds the hash of the Secret's current
// generation, exactly once per generation.
func (r *VMReconciler) announce(ctx context.Context, vm *metav1.PartialObjectMetadata, secret *corev1.Secret) (ctrl.Result, error) {
	generation := vmsecret.Generation(secret)
	bsls := vmsecret.Server(secret)
	previous := announcedOf(secret)
	if generation == "" || previous.covers(bsls, generation) {
		return ctrl.Result{}, nil
	}
	want := CurrentHash(secret)
	if want == nil {
		return ctrl.Result{}, nil // the Hasher's write of the hash brings us back
	}
	username := identity.OfVM(vm.Name, vm.Namespace)
	usersKey := types.NamespacedName{Namespace: bsls.Namespace, Name: userset.SecretName(bsls.Name, userset.ShardOf(username))}
	users := &corev1.Secret{}
	if err := r.Client.Get(ctx, usersKey, users); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil // the BSLS reconciler's write brings us back
		}
		return ctrl.Result{}, fmt.Errorf("get users Secret %s: %w", usersKey, err)
	}
	if users.Labels[userset.Label] != bsls.Name {
		return ctrl.Result{}, nil // not written by the BSLS reconciler: no evidence
	}
	held, err := userset.Decode(users.Data[userset.Key])
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("read users Secret %s: %w", usersKey, err)
	}
	if got, ok := held[username]; !ok || !sameHash(got, *want) {
		return ctrl.Result{}, nil
	}

	// Record the announcement before making it: should the Event then be
	// lost with the process, that costs one Event, while the other order
	// would repeat it.
	if err := optimistic.Patch(ctx, r.Client, secret, func() { vmsecret.SetAnnounced(secret, bsls.String(), generation) }); err != nil {
		if apierrors.IsConflict(err) {
			// Rotated or re-hashed meanwhile: look at the new version.
			return ctrl.Result{RequeueAfter: retryConflict}, nil
		}
		return ctrl.Result{}, fmt.Errorf("record announced generation on Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	reason, message := announcement(username, bsls, previous, generation)
	r.Recorder.Event(vm, corev1.EventTypeNormal, reason, message)
	observeProvisioning(secret, r.Clock.Now())
	return ctrl.Result{}, nil
}

// remove deletes the Secret as decided, once the API server confirms the
// VM state the decision was made on.
func (r *VMReconciler) remove(ctx context.Context, vmKey types.NamespacedName, secret *corev1.Secret, a action) (ctrl.Result, error) {
	logger := log.FromContext(ctx).WithValues("secret", client.ObjectKeyFromObject(secret))
	live, err := getVM(ctx, r.APIReader, vmKey)
	if err != nil {
		return ctrl.Result{}, err
	}
	if again := decide(live, secret, r.Clock.Now(), r.timing()); again.verdict != a.verdict {
		// The cache is behind the API server; its update brings us back,
		// and the requeue covers a missed one.
		logger.V(1).Info("cache is behind the API server; credential Secret kept", "cached", a.why, "live", again.why)
		return ctrl.Result{RequeueAfter: retryConflict}, nil
	}
	if a.verdict == revoke && live.DeletionTimestamp.IsZero() {
		// Nothing of the owner's is lost: while the VM's own volumes read
		// the Secret (its cloud-init may live only there), it stays. The
		// VM no longer names its server, so the user is not provisioned.
		vm := &kubevirtv1.VirtualMachine{}
		if err := r.APIReader.Get(ctx, vmKey, vm); err != nil {
			if apierrors.IsNotFound(err) {
				return ctrl.Result{RequeueAfter: retryConflict}, nil
			}
			return ctrl.Result{}, fmt.Errorf("get VirtualMachine %s: %w", vmKey, err)
		}
		if volume := volumeReading(vm, secret.Name); volume != "" {
			r.Recorder.Eventf(live, corev1.EventTypeWarning, ReasonSecretInUse,
				"Secret %s is kept although %s: volume %s of the VirtualMachine still reads it (its cloud-init would be lost); it is deleted once no volume does, and its user is not provisioned meanwhile",
				secret.Name, a.why, volume)
			logger.Info("credential Secret kept: a volume of its VM reads it", "volume", volume, "why", a.why)
			return ctrl.Result{}, nil // a change of the VM's spec brings us back
		}
	}
	// Delete exactly the version decided on: one the webhook rewrote since
	// is decided again.
	uid, rv := secret.UID, secret.ResourceVersion
	if err := r.Client.Delete(ctx, secret, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return ctrl.Result{}, nil // gone already (a garbage collector, a user)
		case apierrors.IsConflict(err):
			return ctrl.Result{RequeueAfter: retryConflict}, nil
		}
		return ctrl.Result{}, fmt.Errorf("delete credential Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	username := vmsecret.Identity(secret)
	generation := vmsecret.Generation(secret)
	bsls := vmsecret.Server(secret)
	if a.verdict == revoke {
		r.Recorder.Eventf(live, corev1.EventTypeNormal, ReasonUserRevoked,
			"User %s revoked from BackupStorageLocationServer %s (credentials generation %s): %s; deleted Secret %s",
			username, bsls, generation, a.why, secret.Name)
	}
	// A deleted VM can carry no Event: the log is the audit trail then.
	logger.Info("deleted credential Secret; its user is revoked", "user", username, "server", bsls.String(), "generation", generation, "why", a.why)
	return ctrl.Result{}, nil
}

// announced is the provisioning last announced for a Secret.
type announced struct {
	server     string // <namespace>/<name> of the BSLS; "" for none
	generation string // "" for none
}

func announcedOf(secret *corev1.Secret) announced {
	server, generation := vmsecret.Announced(secret)
	return announced{server: server, generation: generation}
}

// covers is whether a announced the provisioning of generation on bsls.
func (a announced) covers(bsls types.NamespacedName, generation string) bool {
	return a.generation == generation && a.server == bsls.String()
}

// announcement is the Event that announces the provisioning of generation on
// bsls, given what was announced before: a first provisioning on a server
// (the VM's first, or after it moved to another server, whose user the
// webhook issues with the next generation) or a rotation.
func announcement(username string, bsls types.NamespacedName, previous announced, generation string) (reason, message string) {
	if previous.generation == "" || previous.server != bsls.String() {
		return ReasonUserProvisioned, fmt.Sprintf("User %s provisioned on BackupStorageLocationServer %s (credentials generation %s)", username, bsls, generation)
	}
	return ReasonCredentialsRotated, fmt.Sprintf("User %s on BackupStorageLocationServer %s: credentials rotated from generation %s to %s; the previous password no longer authenticates",
		username, bsls, previous.generation, generation)
}

// verdict is what the reconciler does with a credential Secret.
type verdict int

const (
	// leave: not guestbackup's Secret, not this VM's, or already going.
	leave verdict = iota
	// wait: a deletion is due but not yet; decide again after action.after.
	wait
	// adopt: the VM uses the Secret but does not own it yet.
	adopt
	// keep: the VM owns and uses the Secret; announce its provisioning.
	keep
	// revoke: the VM exists but no longer uses the Secret; delete it and
	// record UserRevoked on the VM.
	revoke
	// collect: there is no VM; delete the Secret and log it.
	collect
)

func (v verdict) String() string {
	switch v {
	case leave:
		return "leave"
	case wait:
		return "wait"
	case adopt:
		return "adopt"
	case keep:
		return "keep"
	case revoke:
		return "revoke"
	case collect:
		return "collect"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// action is a decision and why it was taken, in words fit for an Event.
type action struct {
	verdict verdict
	why     string
	// after is when to decide again, for wait.
	after time.Duration
	// pending is the deletion a wait defers.
	pending verdict
}

type timing struct {
	orphanGrace time.Duration
	settle      time.Duration
}

// decide is the whole policy of the reconciler: what to do with a credential
// Secret given its VM's metadata (nil when the API has no VM of that name)
// at time now.
func decide(vm *metav1.PartialObjectMetadata, secret *corev1.Secret, now time.Time, t timing) action {
	switch c := vmsecret.Controller(secret); {
	case !vmsecret.IsManaged(secret):
		// Someone else's Secret under our name: never touched.
		return action{verdict: leave, why: fmt.Sprintf("not labelled %s=%s", vmsecret.LabelManagedBy, vmsecret.ManagedByValue)}
	case !secret.DeletionTimestamp.IsZero():
		return action{verdict: leave, why: "being deleted"}
	case !vmsecret.IsNamedFor(secret):
		return action{verdict: leave, why: fmt.Sprintf("label %s does not name the VM the Secret is named after", vmsecret.LabelVM)}
	case vm != nil && vm.Name != vmsecret.VM(secret):
		return action{verdict: leave, why: "belongs to another VM"}
	case c != nil && !vmsecret.IsVMReference(*c):
		// Another object controls it: adopting would take it over (and
		// the API server allows one controller only).
		return action{verdict: leave, why: fmt.Sprintf("controlled by %s %s", c.Kind, c.Name)}
	}
	server := vmsecret.Server(secret).String()

	var del action
	deletable := lastWrite(secret).Add(t.settle)
	switch {
	case vm != nil && !vm.DeletionTimestamp.IsZero():
		del = action{verdict: revoke, why: "the VirtualMachine is being deleted"}
	case vm != nil:
		switch want := vm.Annotations[v1alpha1.AnnotationServer]; {
		case want == "":
			del = action{verdict: revoke, why: fmt.Sprintf("the VirtualMachine no longer has annotation %s", v1alpha1.AnnotationServer)}
		case want != server:
			del = action{verdict: revoke, why: fmt.Sprintf("the VirtualMachine's annotation %s names %s instead", v1alpha1.AnnotationServer, want)}
		case vm.UID == "":
			return action{verdict: leave, why: "the VirtualMachine has no UID yet"}
		case vmsecret.ControlledBy(secret, vm.Name, vm.UID):
			return action{verdict: keep, why: "controlled by its VirtualMachine"}
		case vmsecret.Password(secret) != "" && CurrentHash(secret) == nil:
			// The Hasher is hashing this password: a write now would make
			// its write conflict and the (slow) hash be computed again.
			// Its write brings the Secret back here.
			return action{verdict: leave, why: "waiting for the password's hash before adopting"}
		default:
			return action{verdict: adopt, why: "its VirtualMachine does not own it yet"}
		}
	case vmsecret.Adopted(secret):
		del = action{verdict: collect, why: "its VirtualMachine was deleted"}
	default:
		del = action{verdict: collect, why: fmt.Sprintf("its VirtualMachine never appeared within %s of admission", t.orphanGrace)}
		if orphaned := secret.CreationTimestamp.Add(t.orphanGrace); orphaned.After(deletable) {
			deletable = orphaned
		}
	}
	if now.Before(deletable) {
		return action{verdict: wait, why: del.why, after: deletable.Sub(now), pending: del.verdict}
	}
	return del
}

// lastWrite is when the Secret was last written, as far as the API server
// records it: its creation or the latest change of a field manager's fields.
func lastWrite(secret *corev1.Secret) time.Time {
	t := secret.CreationTimestamp.Time
	for _, mf := range secret.ManagedFields {
		if mf.Time != nil && mf.Time.After(t) {
			t = mf.Time.Time
		}
	}
	return t
}

func sameHash(a, b identity.Hash) bool {
	return a.Version == b.Version && bytes.Equal(a.Value, b.Value)
}

// volumeReading is the name of a volume of vm's template that reads
// Secret name, "" when none does.
func volumeReading(vm *kubevirtv1.VirtualMachine, name string) string {
	if vm.Spec.Template == nil {
		return ""
	}
	for _, v := range vm.Spec.Template.Spec.Volumes {
		if slices.Contains(vmsecret.SecretsRead(v.VolumeSource), name) {
			return v.Name
		}
	}
	return ""
}
