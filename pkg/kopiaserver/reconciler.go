package kopiaserver

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers,verbs=get;list;watch
// Everything the reconciler writes it writes by server-side apply (patch;
// an apply that creates the object also needs create) or, for what must
// never be overwritten, by create alone.
// docs/security.md ("Permissions") says which code needs each rule.
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch
// The server pod's Role lets it update its activity ConfigMaps: RBAC lets
// the controller write that Role only if it holds the same right.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=update
// It creates the Lease the server pods of a BSLS with several elect their
// maintenance runner with, and never reads or writes it again: the pods'
// right to it is a ClusterRole the controller binds (the chart grants it
// bind on that one ClusterRole, whose name only the chart knows).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=create
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=pods;namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=cert-manager.io,resources=certificates,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch

// FieldOwner is the server-side apply field manager of everything the
// controller writes.
const FieldOwner = "guestbackup-controller"

// retryProblem is how soon a BSLS with a problem that no watch reports
// fixed (a claim or an issuer created later) is looked at again.
const retryProblem = 30 * time.Second

// RecheckSecrets is how often every BSLS is reconciled again without an
// event. The controller watches only guestbackup's own Secrets: an admin's
// TLS, S3 or repository password Secret and Velero's credential Secret are
// read uncached and not watched, so a change to one of them reaches the
// server within this period (a missing or invalid one within retryProblem).
const RecheckSecrets = 5 * time.Minute

// Reconciler turns each BackupStorageLocationServer into a running Kopia
// server: storage, repository password, certificate, server workload and
// the users Secrets its pod syncs from, and reports all of it in status.
type Reconciler struct {
	Client client.Client
	// APIReader reads around the cache. The controller caches only
	// guestbackup's Secrets (app.kubernetes.io/managed-by=guestbackup), so
	// every Secret an admin or another party names (TLS, S3 or password
	// Secret, Velero's credentials, cert-manager's output) is read here;
	// default mgr.GetAPIReader().
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  record.EventRecorder
	// Image holds kopia and guestbackup-server; server pods run it.
	Image string
	// ControllerNamespace is admitted by every server's NetworkPolicy.
	ControllerNamespace string
	// MaintenanceClusterRole is the ClusterRole bound to the server pods of
	// a BSLS with several replicas (MaintenanceRoleBinding); default
	// DefaultMaintenanceClusterRole.
	MaintenanceClusterRole string
	// CertManagerCA has cert-manager issue the CA of each BSLS that names
	// no issuer or Secret (a selfSigned Issuer, a CA Certificate and a CA
	// Issuer in its namespace), when its CRDs are served; false: the
	// controller issues that CA itself. Either way each BSLS has a CA of
	// its own, in Secret <bsls>-ca, so switching keeps the guests' pin.
	CertManagerCA bool
	// CertManager is true when cert-manager's Certificate CRD is served;
	// SetupWithManager detects it.
	CertManager bool
	// ActivityInterval is how often server pods publish their guests' new
	// snapshots for the audit; 0 disables it.
	ActivityInterval time.Duration
	// Requests carries GuestSnapshots and GuestRestores to their guests, through the users
	// Secrets (alpha: the chart sets it, and installs the API, with
	// requests.enabled).
	Requests bool
	// Clock tells the time; default (SetupWithManager): the real clock.
	Clock clock.PassiveClock
	// CARotationMinOverlap is how long a CA rotation gives guests the next
	// CA at least before the server switches; default
	// DefaultCARotationMinOverlap.
	CARotationMinOverlap time.Duration
	// CARotationClientOverlap is how long a CA rotation gives the
	// workloads of BackupClients to restart with the next CA; default
	// DefaultCARotationClientOverlap.
	CARotationClientOverlap time.Duration

	// grantRefusals and userRefusals are the refusals already announced
	// (RestoreAccessRefused on a VM, UserRefused on the BSLS).
	grantRefusals announcements[types.NamespacedName]
	userRefusals  announcements[string]
	// rescueRefusals are the CA rescue Secrets announced as ignored
	// (CARescueIgnored), by name.
	rescueRefusals announcements[string]
}

// SetupWithManager registers the reconciler and what it watches.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Scheme == nil {
		r.Scheme = mgr.GetScheme()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorderFor(FieldOwner)
	}
	_, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: certmanagerv1.SchemeGroupVersion.Group, Kind: "Certificate"}, certmanagerv1.SchemeGroupVersion.Version)
	switch {
	case err == nil:
		r.CertManager = true
	case meta.IsNoMatchError(err):
		r.CertManager = false
	default:
		return fmt.Errorf("look up cert-manager's Certificate kind: %w", err)
	}

	b := ctrl.NewControllerManagedBy(mgr).
		Named("backupstoragelocationserver").
		For(&v1alpha1.BackupStorageLocationServer{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&networkingv1.NetworkPolicy{}).
		// Secrets (only guestbackup's are cached and watched, see
		// RecheckSecrets): credential Secrets name their BSLS; the others
		// concern the BSLSs of their namespace.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.bslsOfSecret)).
		Watches(&corev1.PersistentVolumeClaim{}, handler.EnqueueRequestsFromMapFunc(r.bslsInNamespace)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(bslsOfPod)).
		// The server pod publishes its maintenance runs there.
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(bslsOfMaintenanceConfigMap)).
		// A namespace's labels decide whether its VMs may use a server.
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.allBSLS), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// A VM's annotation says which server its user lives on (metadata
		// only, the cache the VM reconciler shares).
		Watches(&kubevirtv1.VirtualMachine{}, handler.EnqueueRequestsFromMapFunc(bslsOfVM), builder.OnlyMetadata, builder.WithPredicates(vmIdentityChanged())).
		// A BackupClient names its server (its Secret, watched above,
		// carries the hash).
		Watches(&v1alpha1.BackupClient{}, handler.EnqueueRequestsFromMapFunc(bslsOfClient))
	if r.CertManager {
		b = b.Owns(&certmanagerv1.Certificate{})
	}
	if r.Requests {
		// A request's phase decides whether its guest is handed it.
		b = b.Watches(&v1alpha1.GuestSnapshot{}, handler.EnqueueRequestsFromMapFunc(r.bslsOfRequest)).
			Watches(&v1alpha1.GuestRestore{}, handler.EnqueueRequestsFromMapFunc(r.bslsOfRequest))
	}
	switch _, err := mgr.GetRESTMapper().RESTMapping(VeleroBSL.GroupKind(), VeleroBSL.Version); {
	case err == nil:
		// A Velero BSL's bucket or credentials changed: its users follow.
		bsl := &unstructured.Unstructured{}
		bsl.SetGroupVersionKind(VeleroBSL)
		b = b.Watches(bsl, handler.EnqueueRequestsFromMapFunc(r.bslsUsingVelero))
	case !meta.IsNoMatchError(err):
		return fmt.Errorf("look up Velero's BackupStorageLocation kind: %w", err)
	}
	// A CA Secret whose BSLS went while no controller ran keeps its guard
	// otherwise.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if err := r.releaseOrphanedCAs(ctx); err != nil {
			log.FromContext(ctx).Error(err, "release the CA Secrets of BackupStorageLocationServers that no longer exist")
		}
		return nil
	})); err != nil {
		return fmt.Errorf("add the release of orphaned CA Secrets: %w", err)
	}
	return b.Complete(r)
}

func (r *Reconciler) bslsOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	l := o.GetLabels()
	if vmsecret.Selector().Matches(labels.Set(l)) {
		if ns, name := l[v1alpha1.LabelServerNamespace], l[v1alpha1.LabelServerName]; ns != "" && name != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
		}
		return nil
	}
	if name := l[clientsecret.LabelClient]; name != "" && l[v1alpha1.LabelManagedBy] == v1alpha1.ManagedByValue {
		return r.bslsOfClientSecret(ctx, o, name)
	}
	if l[userset.Label] != "" {
		return nil // written by this reconciler
	}
	// An admin's TLS, S3 or password Secret, or a Velero credential Secret.
	return r.listBSLS(ctx, func(b *v1alpha1.BackupStorageLocationServer) bool {
		ref := b.Spec.Storage.BackupStorageLocation
		return b.Namespace == o.GetNamespace() || (ref != nil && ref.Namespace == o.GetNamespace())
	})
}

// bslsUsingVelero are the BSLSs that reuse a Velero BSL.
func (r *Reconciler) bslsUsingVelero(ctx context.Context, o client.Object) []reconcile.Request {
	return r.listBSLS(ctx, func(b *v1alpha1.BackupStorageLocationServer) bool {
		ref := b.Spec.Storage.BackupStorageLocation
		return ref != nil && ref.Namespace == o.GetNamespace() && ref.Name == o.GetName()
	})
}

func (r *Reconciler) bslsInNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	return r.listBSLS(ctx, func(b *v1alpha1.BackupStorageLocationServer) bool { return b.Namespace == o.GetNamespace() })
}

func (r *Reconciler) allBSLS(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.listBSLS(ctx, func(*v1alpha1.BackupStorageLocationServer) bool { return true })
}

// listBSLS returns the BSLSs (from the cache) for which match is true.
func (r *Reconciler) listBSLS(ctx context.Context, match func(*v1alpha1.BackupStorageLocationServer) bool) []reconcile.Request {
	list := &v1alpha1.BackupStorageLocationServerList{}
	if err := r.Client.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "list BackupStorageLocationServers")
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if match(&list.Items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

func bslsOfPod(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[LabelBSLS]
	if name == "" || o.GetLabels()[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// own sets b as obj's controlling owner.
func (r *Reconciler) own(b *v1alpha1.BackupStorageLocationServer, obj client.Object) error {
	if err := controllerutil.SetControllerReference(b, obj, r.Scheme); err != nil {
		return fmt.Errorf("own %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// apply writes obj, owned by b, with server-side apply: fields the
// controller does not set (defaults, other managers') are left alone, and
// an unchanged object is not written.
func (r *Reconciler) apply(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, obj client.Object) error {
	if err := r.own(b, obj); err != nil {
		return err
	}
	obj.SetManagedFields(nil)
	if err := r.Client.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil { //nolint:staticcheck // typed objects; Apply configurations are not generated for our CRD's dependents
		return fmt.Errorf("apply %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// Reconcile brings one BSLS's server to its spec and reports in status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	if err != nil {
		errorsMetric.WithLabelValues(req.Namespace, req.Name).Inc()
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	// The BSLS is read around the cache: a pass judges what changed
	// against the status it reads, and announces it (the BSLS's Events,
	// the VMs' notices). Read from a cache that has not yet seen the
	// previous pass's status, it would announce the same change twice,
	// and its status write, locked to that old version, would fail.
	b := &v1alpha1.BackupStorageLocationServer{}
	if err := r.APIReader.Get(ctx, req.NamespacedName, b); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, r.releaseCA(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	if !b.DeletionTimestamp.IsZero() {
		r.forget(req.NamespacedName)
		// Owned objects go with it; the repository, its password and the
		// CA stay (see AnnotationKeep), the CA no longer guarded: no
		// controller would finish a later deletion of it.
		if err := r.finalizeWith(ctx, b, FinalizerCAGuard, func() error { return r.releaseCA(ctx, req.NamespacedName) }); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.finalize(ctx, b)
	}
	obs, err := r.prepare(ctx, b)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.observe(ctx, b, &obs); err != nil {
		return ctrl.Result{}, err
	}
	want, err := desire(obs)
	if err != nil {
		return ctrl.Result{}, err
	}
	return r.write(ctx, b, obs, want)
}

// prepare runs, in order, the steps of a pass that must write before or
// while they read, because what they write is what the rest of the pass
// observes or the server pod needs before it can start, and returns what
// they found. A problem an admin must fix is an observation, not an error:
// errors are the API's, and are retried. Everything else the pass writes is
// decided by desire and written by write.
func (r *Reconciler) prepare(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (observations, error) {
	obs := observations{
		BSLS: b.DeepCopy(), Now: r.Clock.Now(), ControllerNamespace: r.ControllerNamespace, Requests: r.Requests,
		Workload: WorkloadInputs{Image: r.Image, ActivityInterval: r.ActivityInterval},
	}
	var err error

	// Storage and the repository password: the claim, the CA bundle
	// ConfigMap and a generated password are created here, because the
	// storage's problem is what they find, and the Deployment mounts them.
	if obs.RepositoryProblem, err = r.storage(ctx, b, &obs.Workload); err != nil {
		return obs, err
	}
	if obs.RepositoryProblem == nil {
		if obs.RepositoryProblem, err = r.repositoryPassword(ctx, b); err != nil {
			return obs, err
		}
	}

	// The CA guests trust survives its Secret's deletion
	// (docs/security.md), so it is guarded before anything reads that
	// Secret.
	if obs.CAGuardRetry, err = r.guardOwnCA(ctx, b); err != nil {
		return obs, err
	}
	// The certificate, and the CA guests are given to trust: it is issued
	// (by the controller or cert-manager) before its Secret is read, and
	// the Secret's checksum restarts the pod on a new one.
	if obs.Certificate, obs.CertificateProblem, err = r.certificate(ctx, b); err != nil {
		return obs, err
	}

	// The server-control password, created once: the Deployment reads it.
	if err := r.controlSecret(ctx, b); err != nil {
		return obs, err
	}
	// The users Secrets: the users they hold, the refused credential
	// Secrets and the grants are what UsersSynced, status.users and the
	// quotas report, and their Events are about what was written.
	if obs.Users, err = r.syncUsers(ctx, b); err != nil {
		return obs, err
	}
	// The ConfigMaps the server pod may only update: they must exist
	// before it starts.
	if err := r.activityConfigMaps(ctx, b); err != nil {
		return obs, err
	}
	// The state ConfigMap, created if missing (its pod may only update it)
	// and cleared of gone pods' states while it is read.
	state, err := r.serverState(ctx, b)
	if err != nil {
		return obs, err
	}
	obs.Maintenance, obs.Client, obs.Storage = state.Maintenance, state.Client, state.Storage
	obs.Integrity, obs.IntegrityUnreadable = state.Integrity, state.IntegrityUnreadable
	// The Lease several server pods elect their maintenance runner with is
	// created once and never written again (nor read back), and its
	// binding goes when the BSLS runs one pod: neither is desired state
	// applied on every pass.
	if err := r.maintenanceElection(ctx, b); err != nil {
		return obs, err
	}
	return obs, nil
}

// observe reads, without writing, what the server runs as: its
// namespace (whether the platform assigns the pod's IDs shapes its
// securityContext), its Deployment and its pods.
func (r *Reconciler) observe(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, obs *observations) error {
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: b.Namespace}, ns); err != nil {
		return fmt.Errorf("get namespace %s: %w", b.Namespace, err)
	}
	obs.Workload.PlatformAssignsIDs = AssignsPodIDs(ns)
	d := &appsv1.Deployment{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: DeploymentName(b)}, d); {
	case err == nil:
		obs.Deployment = d
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("get Deployment %s: %w", DeploymentName(b), err)
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(b.Namespace), client.MatchingLabels(Labels(b))); err != nil {
		return fmt.Errorf("list server pods: %w", err)
	}
	obs.Pods = pods.Items
	return nil
}

// write applies what desire decided: the server's objects, in order, then
// b's status; the Events of the pass only once that status is written, so
// that a pass whose status write fails (a conflict with another writer)
// announces nothing its successor announces again. The VMs' notices go
// before it (why: below).
func (r *Reconciler) write(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, obs observations, want desired) (ctrl.Result, error) {
	for _, obj := range want.Objects {
		if err := r.apply(ctx, b, obj); err != nil {
			return ctrl.Result{}, err
		}
	}
	// The status is written locked to the version the pass read (or
	// wrote itself: prepare's finalizer patch is locked too), so that a
	// pass that read a BSLS older than the API server's, from a cache
	// that had not caught up, cannot write over a newer status with what
	// it derived from the old one ("keeps what it knew" of a verification
	// would keep what it knew before). It fails with a conflict, and the
	// next pass reads again.
	orig := b.DeepCopy()
	orig.Status = obs.BSLS.Status
	b.Status = want.Status
	recordMetrics(b, obs.Users, meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.ConditionReady))

	// A VM's notice is recorded before the status that makes it old news
	// is written: after it, a controller that stopped between the two
	// would never announce it (the next pass diffs against the new
	// status), and the VM's owner, who may read no BSLS, would not learn
	// that its backups are damaged or over quota. A repeat after a failed
	// write is the lesser harm. The BSLS's own Events repeat what its
	// status says, so they wait for it.
	notices, err := r.liveNotices(ctx, obs.BSLS, want.decision)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.recordVMNotices(ctx, notices)
	if err := r.Client.Status().Patch(ctx, b, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("update status of %s/%s: %w", b.Namespace, b.Name, err)
	}
	for _, e := range want.Events {
		r.Recorder.Event(b, e.Type, e.Reason, e.Message)
	}
	return ctrl.Result{RequeueAfter: want.RequeueAfter}, nil
}

// syncUsers writes the users Secrets from the credential Secrets.
func (r *Reconciler) syncUsers(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (UserSet, error) {
	server := client.ObjectKeyFromObject(b)
	secrets := &corev1.SecretList{}
	if err := r.Client.List(ctx, secrets, client.MatchingLabels(vmsecret.ServerLabels(server))); err != nil {
		return UserSet{}, fmt.Errorf("list credential Secrets of %s: %w", server, err)
	}
	allowed, err := r.allowedNamespaces(ctx, b)
	if err != nil {
		return UserSet{}, err
	}
	vms, err := r.vmsOf(ctx, secrets.Items)
	if err != nil {
		return UserSet{}, err
	}
	users := CollectUsers(UserInputs{Server: server, Secrets: secrets.Items, VMs: vms, Allowed: allowed, HashOf: credentials.HashFor, Now: r.Clock.Now()})
	clients, clientSecrets, err := r.clientsOf(ctx, server)
	if err != nil {
		return UserSet{}, err
	}
	CollectClients(&users, ClientInputs{Server: server, Clients: clients, Secrets: clientSecrets, Allowed: allowed})
	asked, err := r.listRequests(ctx)
	if err != nil {
		return UserSet{}, err
	}
	requests := userset.Dispatch(QueueRequests(asked, vms, users))
	for shard, hashes := range users.Shards {
		s := &corev1.Secret{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{
				Name: userset.SecretName(b.Name, shard), Namespace: b.Namespace,
				Labels: labels.Merge(Labels(b), map[string]string{userset.Label: b.Name}),
			},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{
				userset.Key:       userset.Encode(hashes),
				userset.GrantsKey: userset.EncodeGrants(users.Grants[shard]),
				userset.QuotasKey: userset.EncodeQuotas(quotasOf(b.Spec.Quota, hashes)),
			},
		}
		if r.Requests {
			guests, jobs := userset.SplitJobs(requests[shard])
			s.Data[userset.RequestsKey] = userset.EncodeRequests(guests)
			if len(jobs) > 0 {
				s.Data[userset.JobRequestsKey] = userset.EncodeRequests(jobs)
			}
		}
		before, err := r.grantsWritten(ctx, s, users.Grants[shard])
		if err != nil {
			return UserSet{}, err
		}
		if err := r.apply(ctx, b, s); err != nil {
			return UserSet{}, err
		}
		r.recordGrantChanges(ctx, server, before, users.Grants[shard])
	}
	for _, vm := range r.grantRefusals.news(r.Clock, server, users.GrantsRefused) {
		if m := vms[vm]; m != nil {
			vmevent.Record(r.Recorder, m.ObjectMeta, []vmevent.Event{vmevent.Warning(ReasonRestoreAccessRefused, users.GrantsRefused[vm])})
		}
	}
	for _, k := range r.userRefusals.news(r.Clock, server, users.Refused) {
		// Logged too: the Event may be aggregated with similar ones or
		// dropped once its reason's budget is spent (Secrets refused by
		// the dozen), the log line is the record that names each.
		log.FromContext(ctx).Info("credential Secret refused", "secret", k, "why", users.Refused[k])
		r.Recorder.Eventf(b, corev1.EventTypeWarning, ReasonUserRefused, "Credential Secret %s is not provisioned: %s", k, users.Refused[k])
	}
	return users, nil
}

// forget drops what the reconciler keeps about a BSLS that is gone or
// going: its metrics and the refusals it announced (a BSLS created again
// under the name is a new object, whose Events announce them anew).
func (r *Reconciler) forget(server types.NamespacedName) {
	forgetMetrics(server.Namespace, server.Name)
	r.userRefusals.forget(server)
	r.grantRefusals.forget(server)
	r.rescueRefusals.forget(server)
}

// grantsWritten returns the grants the users Secret s holds now: from the
// cache, or, when they differ from want, read around it, so that a cache
// that lags behind the last write never announces a grant twice.
func (r *Reconciler) grantsWritten(ctx context.Context, s *corev1.Secret, want []userset.Grant) ([]userset.Grant, error) {
	read := func(reader client.Reader) ([]userset.Grant, error) {
		cur := &corev1.Secret{}
		if err := reader.Get(ctx, client.ObjectKeyFromObject(s), cur); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		g, _ := userset.DecodeGrants(cur.Data[userset.GrantsKey]) // only ever written here; unreadable: none
		return g, nil
	}
	cached, err := read(r.Client)
	if err != nil || bytes.Equal(userset.EncodeGrants(cached), userset.EncodeGrants(want)) {
		return cached, err
	}
	live, err := read(r.APIReader)
	if err != nil {
		return nil, fmt.Errorf("read users Secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	return live, nil
}

// grantLimit is what a grant's end cannot take back, said in both its
// Events so that an owner who grants access knows: Kopia serves content
// to any user who names its ID (docs/security.md).
const grantLimit = "files and folders whose IDs the guest read or noted under the grant stay readable by those IDs for as long as they are in the repository"

// recordGrantChanges records, on the grantee and on the VM whose snapshots
// it reads (each when it exists), the grants written and removed. What the
// grantee's guest then reads is not recorded: Kopia's server keeps no
// record of reads (docs/guest.md).
func (r *Reconciler) recordGrantChanges(ctx context.Context, server types.NamespacedName, before, after []userset.Grant) {
	had := map[userset.Grant]bool{}
	for _, g := range before {
		had[g] = true
	}
	has := map[userset.Grant]bool{}
	for _, g := range after {
		has[g] = true
		if !had[g] {
			r.recordGrant(ctx, g, ReasonRestoreAccessGranted,
				fmt.Sprintf("This VM's guest may read the snapshots of %s on BackupStorageLocationServer %s, read-only, until annotation %s is removed: guestbackup-kopia snapshot list %s (docs/guest.md). Removing it ends the listing and reading of those snapshots; %s", g.Source, server, v1alpha1.AnnotationRestoreFrom, g.Source, grantLimit),
				fmt.Sprintf("The guest of VirtualMachine %s may read this VM's snapshots (%s) on BackupStorageLocationServer %s, read-only, until its annotation %s is removed; %s", vmOf(g.Grantee), g.Source, server, v1alpha1.AnnotationRestoreFrom, grantLimit))
		}
	}
	for _, g := range before {
		if !has[g] {
			r.recordGrant(ctx, g, ReasonRestoreAccessRevoked,
				fmt.Sprintf("This VM's guest may no longer read the snapshots of %s on BackupStorageLocationServer %s; %s", g.Source, server, grantLimit),
				fmt.Sprintf("The guest of VirtualMachine %s may no longer read this VM's snapshots (%s) on BackupStorageLocationServer %s; %s", vmOf(g.Grantee), g.Source, server, grantLimit))
		}
	}
}

// recordGrant records one grant's change on the grantee and on the source.
func (r *Reconciler) recordGrant(ctx context.Context, g userset.Grant, reason, toGrantee, toSource string) {
	for _, side := range []struct{ user, message string }{{g.Grantee, toGrantee}, {g.Source, toSource}} {
		name, ns, _ := strings.Cut(side.user, "@")
		vm := &metav1.PartialObjectMetadata{}
		vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, vm); err != nil {
			continue // a deleted VM cannot carry an Event
		}
		vmevent.Record(r.Recorder, vm.ObjectMeta, []vmevent.Event{vmevent.Normal(reason, side.message)})
	}
}

// vmOf is the VM name of an identity <vm>@<namespace>.
func vmOf(user string) string {
	name, _, _ := strings.Cut(user, "@")
	return name
}

// vmsOf reads, from the cache, the metadata of the VirtualMachines the
// credential Secrets are labelled for: whose Secret each is, and which
// server it names, are facts about the VM.
func (r *Reconciler) vmsOf(ctx context.Context, secrets []corev1.Secret) (map[types.NamespacedName]*metav1.PartialObjectMetadata, error) {
	vms := map[types.NamespacedName]*metav1.PartialObjectMetadata{}
	for i := range secrets {
		name := vmsecret.VM(&secrets[i])
		key := types.NamespacedName{Namespace: secrets[i].Namespace, Name: name}
		if _, seen := vms[key]; seen || name == "" {
			continue
		}
		vm := &metav1.PartialObjectMetadata{}
		vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
		switch err := r.Client.Get(ctx, key, vm); {
		case apierrors.IsNotFound(err):
			vms[key] = nil
		case err != nil:
			return nil, fmt.Errorf("get VirtualMachine %s: %w", key, err)
		default:
			vms[key] = vm
		}
	}
	return vms, nil
}

// bslsOfVM maps a VirtualMachine to the BSLS its annotation names: on an
// update, the handler maps the old and the new VM, so a VM that moves
// reaches both servers.
func bslsOfVM(_ context.Context, o client.Object) []reconcile.Request {
	ref, err := vmsecret.ParseServerRef(o.GetAnnotations()[v1alpha1.AnnotationServer])
	if err != nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: ref}}
}

// vmIdentityChanged passes the VM events that change a user or its
// grant: creation, deletion, and an update of the server or restore-from
// annotation or the UID.
func vmIdentityChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetAnnotations()[v1alpha1.AnnotationServer] != e.ObjectNew.GetAnnotations()[v1alpha1.AnnotationServer] ||
			e.ObjectOld.GetAnnotations()[v1alpha1.AnnotationRestoreFrom] != e.ObjectNew.GetAnnotations()[v1alpha1.AnnotationRestoreFrom] ||
			e.ObjectOld.GetUID() != e.ObjectNew.GetUID()
	}}
}

// publishedConfigMaps are the names of the ConfigMaps b's server pod
// publishes its guests in: their activity, then their catalogues.
func publishedConfigMaps(b *v1alpha1.BackupStorageLocationServer) []string {
	names := make([]string, 0, userset.Shards+activity.CatalogueShards)
	for shard := range userset.Shards {
		names = append(names, activity.ConfigMapName(b.Name, shard))
	}
	for shard := range activity.CatalogueShards {
		names = append(names, activity.CatalogueConfigMapName(b.Name, shard))
	}
	return names
}

// activityConfigMaps creates the ConfigMaps the server pod publishes its
// guests' activity and catalogues in (publishedConfigMaps); their content is the server pod's, never rewritten
// here. One that exists without a controller (restored from a backup
// before its BSLS, or written by hand) is adopted: the audit and the
// request status believe only a ConfigMap the BSLS controls, and would
// otherwise ignore every guest of its shard for good. One that another
// object controls is left, and logged.
func (r *Reconciler) activityConfigMaps(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) error {
	for _, name := range publishedConfigMaps(b) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: b.Namespace,
			Labels: labels.Merge(Labels(b), map[string]string{activity.Label: b.Name}),
		}}
		existing := &corev1.ConfigMap{}
		err := r.Client.Get(ctx, client.ObjectKeyFromObject(cm), existing)
		if apierrors.IsNotFound(err) {
			if err := r.own(b, cm); err != nil {
				return err
			}
			err = r.Client.Create(ctx, cm)
			if !apierrors.IsAlreadyExists(err) {
				if err != nil {
					return fmt.Errorf("create ConfigMap %s: %w", cm.Name, err)
				}
				continue
			}
			// There, without guestbackup's labels, so outside the cache.
			err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(cm), existing)
		}
		if err != nil {
			return fmt.Errorf("get ConfigMap %s: %w", cm.Name, err)
		}
		if err := r.adoptActivity(ctx, b, existing, cm.Labels); err != nil {
			return err
		}
	}
	return nil
}

// adoptActivity makes b the controller of activity ConfigMap cm, with
// the labels want, when nothing controls it.
func (r *Reconciler) adoptActivity(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, cm *corev1.ConfigMap, want map[string]string) error {
	switch owner := metav1.GetControllerOf(cm); {
	case metav1.IsControlledBy(cm, b):
		return nil
	case owner != nil:
		log.FromContext(ctx).Info("activity ConfigMap controlled by another object: its guests' activity is not believed; delete it for the controller to create it again",
			"configMap", client.ObjectKeyFromObject(cm), "controller", owner.Kind+"/"+owner.Name)
		return nil
	}
	patch := client.MergeFromWithOptions(cm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	maps.Copy(cm.Labels, want)
	if err := r.own(b, cm); err != nil {
		return err
	}
	if err := r.Client.Patch(ctx, cm, patch); err != nil {
		return fmt.Errorf("adopt ConfigMap %s: %w", cm.Name, err)
	}
	return nil
}

// Admits is whether b's spec.access.namespaceSelector admits namespace ns:
// the rule allowedNamespaces applies to every namespace at once, for one.
func Admits(b *v1alpha1.BackupStorageLocationServer, ns *corev1.Namespace) (bool, error) {
	ls := b.Spec.Access.NamespaceSelector
	if ls == nil {
		return ns.Name == b.Namespace, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return false, fmt.Errorf("spec.access.namespaceSelector of %s/%s: %w", b.Namespace, b.Name, err)
	}
	return sel.Matches(labels.Set(ns.Labels)), nil
}

// AdmitsClient is whether b's server provisions a BackupClient of
// namespace ns: one Admits admits, or one of b's own namespace, whose admin
// is b's (a host outside the cluster it declares).
func AdmitsClient(b *v1alpha1.BackupStorageLocationServer, ns *corev1.Namespace) (bool, error) {
	if ns.Name == b.Namespace {
		return true, nil
	}
	return Admits(b, ns)
}

// allowedNamespaces returns whether a namespace's VMs may use b's server:
// the BSLS's own namespace when it has no selector, else the namespaces
// the selector matches.
func (r *Reconciler) allowedNamespaces(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (func(string) bool, error) {
	ls := b.Spec.Access.NamespaceSelector
	if ls == nil {
		return func(ns string) bool { return ns == b.Namespace }, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, fmt.Errorf("spec.access.namespaceSelector of %s/%s: %w", b.Namespace, b.Name, err)
	}
	list := &corev1.NamespaceList{}
	if err := r.Client.List(ctx, list, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	names := map[string]bool{}
	for _, ns := range list.Items {
		names[ns.Name] = true
	}
	return func(ns string) bool { return names[ns] }, nil
}
