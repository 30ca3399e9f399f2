// Package backupclient reconciles BackupClients (docs/design.md, decision
// 25): a workload of an admitted namespace opts in to a BSLS, and the
// controller issues its own credentials into a Secret of its namespace
// (package clientsecret), whose hash the BSLS reconciler hands the server.
// Each pass gathers what it needs, asks decide (a pure function) what to
// do, then writes the Secret, the status and the Events.
package backupclient

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/optimistic"
	"github.com/guestbackup/guestbackup/pkg/password"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// The reconciler reads BackupClients and writes their status; it writes
// their Secrets (cached: they are labelled as guestbackup's); it reads the
// BSLSs, their users Secrets and the namespaces' labels.
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupclients,verbs=get;list;watch
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupclients/status,verbs=get;patch
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// retryConflict is how soon a pass that another write overtook is tried
// again, should that write's own event be missed.
const retryConflict = time.Second

// FieldOwner is the reconciler's field manager.
const FieldOwner = "guestbackup-backupclient"

// hashRecheck is how often the hash of a client's own password
// (spec.passwordHash) is read again: its admin's Secret is not cached, and
// a new hash in it is a rotation.
const hashRecheck = time.Minute

// Reconciler issues, rotates and withdraws BackupClients' credentials.
type Reconciler struct {
	Client client.Client
	// APIReader reads the Secrets that hold the hashes of admins' own
	// passwords (spec.passwordHash), uncached: the cache holds only
	// guestbackup's own Secrets; default: the manager's.
	APIReader client.Reader
	// Recorder records Events on BackupClients; default: the manager's.
	Recorder record.EventRecorder
	// Clock tells the time of conditions' transitions; default: the real
	// clock.
	Clock clock.PassiveClock
}

// SetupWithManager registers the reconciler. A client is decided again when
// it changes, when its Secret does, when its server's status or access
// does (endpoint, CA, namespaceSelector), when the server's users Secrets
// change (provisioned), and when a namespace's labels do (admission).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorderFor(FieldOwner)
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("backupclient").
		For(&v1alpha1.BackupClient{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Secret{}).
		Watches(&v1alpha1.BackupStorageLocationServer{}, handler.EnqueueRequestsFromMapFunc(r.clientsOfServer)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.clientsOfUsersSecret)).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.clientsInNamespace), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(clientsOfActivity),
			builder.WithPredicates(predicate.NewPredicateFuncs(audit.IsServersActivity))).
		Complete(r)
}

// clientsOfActivity maps an activity ConfigMap to the BackupClients whose
// identities it lists (identity.ClientOf).
func clientsOfActivity(_ context.Context, o client.Object) []reconcile.Request {
	cm, ok := o.(*corev1.ConfigMap)
	// Most servers have no client: their shards, up to 10,000 VMs' worth,
	// are not decoded again for none.
	if !ok || cm.Labels[activity.Label] == "" || !strings.Contains(cm.Data[activity.Key], identity.ClientHostSuffix+`"`) {
		return nil
	}
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for user := range guests {
		if name, namespace, ok := identity.ClientOf(user); ok {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: name}})
		}
	}
	return reqs
}

// clientsWhere lists the clients keep selects, as requests.
func (r *Reconciler) clientsWhere(ctx context.Context, keep func(*v1alpha1.BackupClient) bool, opts ...client.ListOption) []reconcile.Request {
	list := &v1alpha1.BackupClientList{}
	if err := r.Client.List(ctx, list, opts...); err != nil {
		log.FromContext(ctx).Error(err, "list BackupClients")
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if keep(&list.Items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

func (r *Reconciler) clientsOfServer(ctx context.Context, o client.Object) []reconcile.Request {
	return r.clientsWhere(ctx, func(c *v1alpha1.BackupClient) bool {
		return c.Spec.Server == v1alpha1.ServerReference{Namespace: o.GetNamespace(), Name: o.GetName()}
	})
}

func (r *Reconciler) clientsOfUsersSecret(ctx context.Context, o client.Object) []reconcile.Request {
	bsls := o.GetLabels()[userset.Label]
	if bsls == "" {
		return nil
	}
	return r.clientsWhere(ctx, func(c *v1alpha1.BackupClient) bool {
		return c.Spec.Server == v1alpha1.ServerReference{Namespace: o.GetNamespace(), Name: bsls}
	})
}

func (r *Reconciler) clientsInNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	return r.clientsWhere(ctx, func(*v1alpha1.BackupClient) bool { return true }, client.InNamespace(o.GetName()))
}

// Reconcile decides one BackupClient.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	c := &v1alpha1.BackupClient{}
	if err := r.Client.Get(ctx, req.NamespacedName, c); err != nil {
		// A deleted client's Secret goes with it (its owner reference), and
		// its user with the BSLS's next pass, which no longer finds it.
		if apierrors.IsNotFound(err) {
			forgetSeries(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	in, err := r.gather(ctx, c)
	if err != nil {
		return ctrl.Result{}, err
	}
	p := decide(in)
	exportSeries(c, p.Status)
	if err := r.apply(ctx, in, p); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			// Another write overtook this pass: its event brings us back.
			return ctrl.Result{RequeueAfter: retryConflict}, nil
		}
		return ctrl.Result{}, err
	}
	if c.Spec.PasswordHash != nil && in.Server != nil && c.Namespace == in.Server.Namespace {
		// No event says the admin wrote a new hash.
		return ctrl.Result{RequeueAfter: hashRecheck}, nil
	}
	return ctrl.Result{}, nil
}

// gather reads what decide needs.
func (r *Reconciler) gather(ctx context.Context, c *v1alpha1.BackupClient) (inputs, error) {
	in := inputs{Client: c, Now: metav1.NewTime(r.Clock.Now())}
	server := &v1alpha1.BackupStorageLocationServer{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Spec.Server.Namespace, Name: c.Spec.Server.Name}, server); {
	case apierrors.IsNotFound(err):
		server = nil
	case err != nil:
		return in, fmt.Errorf("get BackupStorageLocationServer %s: %w", c.Spec.Server, err)
	}
	in.Server = server
	if server != nil {
		ns := &corev1.Namespace{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: c.Namespace}, ns); err != nil {
			return in, fmt.Errorf("get namespace %s: %w", c.Namespace, err)
		}
		admitted, err := kopiaserver.AdmitsClient(server, ns)
		if err != nil {
			return in, err
		}
		in.Admitted = admitted
		if c.Spec.PasswordHash != nil && c.Namespace == server.Namespace {
			if in.OwnHash, in.HashProblem, err = r.ownHash(ctx, c, server); err != nil {
				return in, err
			}
		}
	}
	secret := &corev1.Secret{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: clientsecret.Name(c)}, secret); {
	case apierrors.IsNotFound(err):
		secret = nil
	case err != nil:
		return in, fmt.Errorf("get Secret %s/%s: %w", c.Namespace, clientsecret.Name(c), err)
	}
	in.Secret = secret
	if server != nil {
		user := identity.OfClient(c.Name, c.Namespace)
		h, err := r.provisioned(ctx, server, user)
		if err != nil {
			return in, err
		}
		in.Provisioned = h
		if in.Activity, err = r.activityOf(ctx, server, user); err != nil {
			return in, err
		}
	}
	return in, nil
}

// activityOf is what server published of user's snapshots; nil when it
// published none. Only the server's own activity ConfigMap counts, the one
// its BSLS controls.
func (r *Reconciler) activityOf(ctx context.Context, server *v1alpha1.BackupStorageLocationServer, user string) (*activity.Guest, error) {
	key := types.NamespacedName{Namespace: server.Namespace, Name: activity.ConfigMapName(server.Name, userset.ShardOf(user))}
	cm := &corev1.ConfigMap{}
	if err := r.Client.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil //nolint:nilnil // nothing published yet
		}
		return nil, fmt.Errorf("get activity ConfigMap %s: %w", key, err)
	}
	if !metav1.IsControlledBy(cm, server) {
		return nil, nil //nolint:nilnil // not the server's own: believed in nothing
	}
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		log.FromContext(ctx).Error(err, "activity ConfigMap unreadable", "configMap", key)
		return nil, nil //nolint:nilnil // what cannot be read announces nothing
	}
	if g, ok := guests[user]; ok {
		return &g, nil
	}
	return nil, nil //nolint:nilnil // no snapshot of the client yet
}

// ownHash reads the hash of the password c's admin chose from the Secret
// c's spec.passwordHash names; problem says why there is none, or why
// server may not take it: a server set to one algorithm (FIPS's pbkdf2)
// takes no hash of another.
func (r *Reconciler) ownHash(ctx context.Context, c *v1alpha1.BackupClient, server *v1alpha1.BackupStorageLocationServer) (h *identity.Hash, problem string, err error) {
	src := c.Spec.PasswordHash
	key := clientsecret.PasswordHashKey(src)
	s := &corev1.Secret{}
	switch err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: src.SecretName}, s); {
	case apierrors.IsNotFound(err):
		return nil, fmt.Sprintf("Secret %s, which spec.passwordHash names, does not exist in namespace %s", src.SecretName, c.Namespace), nil
	case err != nil:
		return nil, "", fmt.Errorf("get Secret %s/%s of spec.passwordHash: %w", c.Namespace, src.SecretName, err)
	}
	v, ok := s.Data[key]
	if !ok {
		return nil, fmt.Sprintf("Secret %s has no key %s: put there the hash `kopia server user hash-password` prints", src.SecretName, key), nil
	}
	parsed, err := identity.ParseHash(strings.TrimSpace(string(v)))
	if err != nil {
		return nil, fmt.Sprintf("key %s of Secret %s holds no password hash as `kopia server user hash-password` prints it: %v", key, src.SecretName, err), nil
	}
	if want := server.Spec.Access.PasswordHash; want != "" && parsed.Version != credentials.HashVersionOf(want, parsed.Version) {
		return nil, fmt.Sprintf("key %s of Secret %s holds a %s hash, and BackupStorageLocationServer %s/%s takes %s hashes only (spec.access.passwordHash), which `kopia server user hash-password` does not make: remove spec.passwordHash to have a password generated",
			key, src.SecretName, parsed.Version, server.Namespace, server.Name, want), nil
	}
	return &parsed, "", nil
}

// provisioned is the hash the users Secret of username's shard holds for
// it on server; nil when it holds none (or no users Secret exists yet).
func (r *Reconciler) provisioned(ctx context.Context, server *v1alpha1.BackupStorageLocationServer, username string) (*identity.Hash, error) {
	key := types.NamespacedName{Namespace: server.Namespace, Name: userset.SecretName(server.Name, userset.ShardOf(username))}
	users := &corev1.Secret{}
	if err := r.Client.Get(ctx, key, users); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil //nolint:nilnil // no users Secret yet: nobody is provisioned
		}
		return nil, fmt.Errorf("get users Secret %s: %w", key, err)
	}
	if users.Labels[userset.Label] != server.Name {
		return nil, nil //nolint:nilnil // not written by the BSLS reconciler: no evidence
	}
	held, err := userset.Decode(users.Data[userset.Key])
	if err != nil {
		return nil, fmt.Errorf("read users Secret %s: %w", key, err)
	}
	if h, ok := held[username]; ok {
		return &h, nil
	}
	return nil, nil //nolint:nilnil // not provisioned
}

// apply writes what p decided: the Secret, then the status, then the
// Events, so that an Event never announces what was not written.
func (r *Reconciler) apply(ctx context.Context, in inputs, p plan) error {
	c := in.Client
	logger := log.FromContext(ctx)
	switch p.Secret {
	case secretIssue:
		creds := clientsecret.Credentials{Generation: p.Generation, Rotate: c.Spec.Rotate}
		if in.OwnHash != nil {
			// The admin's own password: only its hash is here.
			creds.Hash = *in.OwnHash
		} else {
			version := credentials.HashVersionOf(in.Server.Spec.Access.PasswordHash, identity.Scrypt)
			creds.Password = password.New()
			h, err := identity.NewHash(creds.Password, version)
			if err != nil {
				return fmt.Errorf("hash the password of BackupClient %s/%s: %w", c.Namespace, c.Name, err)
			}
			credentials.ObserveHash(version)
			creds.Hash = h
		}
		want := clientsecret.Render(c, clientsecret.Server{URL: in.Server.Status.Endpoint, CA: in.Server.Status.TLSCA}, creds)
		if err := r.writeSecret(ctx, in.Secret, want); err != nil {
			return err
		}
		logger.Info("issued BackupClient credentials", "secret", want.Name, "generation", p.Generation)
	case secretRefresh:
		want := clientsecret.Render(c, clientsecret.Server{URL: in.Server.Status.Endpoint, CA: in.Server.Status.TLSCA}, clientsecret.CredentialsOf(in.Secret))
		if err := r.writeSecret(ctx, in.Secret, want); err != nil {
			return err
		}
	case secretDelete:
		uid, rv := in.Secret.UID, in.Secret.ResourceVersion
		if err := r.Client.Delete(ctx, in.Secret, client.Preconditions{UID: &uid, ResourceVersion: &rv}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete Secret %s/%s: %w", in.Secret.Namespace, in.Secret.Name, err)
		}
		logger.Info("withdrew BackupClient credentials", "secret", in.Secret.Name)
	}
	if !equality.Semantic.DeepEqual(c.Status, p.Status) {
		// Locked to the version decided on: a pass another write overtook
		// decides again rather than write an older view over a newer one.
		base := c.DeepCopy()
		c.Status = p.Status
		if err := r.Client.Status().Patch(ctx, c, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("update status of BackupClient %s/%s: %w", c.Namespace, c.Name, err)
		}
	}
	for _, e := range p.Events {
		r.Recorder.Event(c, e.Type, e.Reason, e.Message)
	}
	return nil
}

// writeSecret creates want, or changes current into it: on the version
// decided on, and on no other (a merge patch locked to its resourceVersion).
func (r *Reconciler) writeSecret(ctx context.Context, current, want *corev1.Secret) error {
	if current == nil {
		if err := r.Client.Create(ctx, want, client.FieldOwner(FieldOwner)); err != nil {
			return fmt.Errorf("create Secret %s/%s: %w", want.Namespace, want.Name, err)
		}
		return nil
	}
	err := optimistic.Patch(ctx, r.Client, current, func() {
		current.Labels, current.Annotations, current.OwnerReferences = want.Labels, want.Annotations, want.OwnerReferences
		current.Data = want.Data
	})
	if err != nil {
		return fmt.Errorf("update Secret %s/%s: %w", want.Namespace, want.Name, err)
	}
	return nil
}
