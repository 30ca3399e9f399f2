package credentials

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/optimistic"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The bootstrap reconciler reads the servers' published endpoint and CA and
// renders the payload of the credential Secrets again.
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// ReasonBootstrapUpdated: the VM's server publishes another endpoint, CA
// or kopia client (a new URL, a renewed CA, a server of another version) than the VM's bootstrap was rendered with; its
// Secret is rendered again, and the guest gets it at its next start.
const ReasonBootstrapUpdated = "BootstrapUpdated"

// BootstrapReconciler keeps the bootstrap in every injected VM's credential
// Secret pointed at its server as the server publishes itself. The webhook
// renders the payload only when it admits a VM, and it never sees a change
// of the server's status.endpoint or status.tlsCA (a CA renewal, a new
// URL): without this, guests would keep the old URL and CA forever. Keyed
// by the VM's namespace and name, it renders the payload again, with the
// same credentials, generation, mode and placement and the owner's own
// merged cloud-config part byte for byte, and records BootstrapUpdated on
// the VM. It never writes a Secret that is not guestbackup's for a VM that
// controls it, nor while the server publishes no endpoint or CA.
type BootstrapReconciler struct {
	Client client.Client
	// APIReader reads the VM around the cache before a write, so that
	// paths and schedule come from the VM as it is stored. Default: the
	// manager's API reader.
	APIReader client.Reader
	// Recorder records the Events on VMs. Default: the manager's.
	Recorder record.EventRecorder
	// Clock stamps when a payload first carries a CA
	// (vmsecret.RenderedCAAt). Default: the real one.
	Clock clock.PassiveClock
}

// SetupWithManager registers the reconciler. It watches the servers'
// endpoint and CA, the credential Secrets (a write by the webhook may
// carry what it read from a cache that was behind) and the VMs'
// annotations.
func (r *BootstrapReconciler) SetupWithManager(mgr ctrl.Manager) error {
	useManager(mgr, &r.Client, &r.APIReader, &r.Recorder)
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("vm-bootstrap").
		For(&kubevirtv1.VirtualMachine{}, builder.OnlyMetadata, builder.WithPredicates(predicate.AnnotationChangedPredicate{})).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(vmOfSecret), credentialSecrets()).
		Watches(&v1alpha1.BackupStorageLocationServer{}, handler.EnqueueRequestsFromMapFunc(r.vmsOfServer),
			builder.WithPredicates(publishedChanged())).
		Complete(r)
}

// publishedChanged passes a server's creation (every Secret is checked
// once at start) and a change of what it publishes to guests.
func publishedChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*v1alpha1.BackupStorageLocationServer)
			n, okNew := e.ObjectNew.(*v1alpha1.BackupStorageLocationServer)
			return !okOld || !okNew || o.Status.Endpoint != n.Status.Endpoint || o.Status.TLSCA != n.Status.TLSCA ||
				clientdist.Digest(o.Status.Client) != clientdist.Digest(n.Status.Client)
		},
		DeleteFunc: func(event.DeleteEvent) bool { return false },
	}
}

// vmsOfServer maps a server to the VMs whose credential Secrets are
// labelled for it.
func (r *BootstrapReconciler) vmsOfServer(ctx context.Context, o client.Object) []reconcile.Request {
	list := &corev1.SecretList{}
	server := client.ObjectKeyFromObject(o)
	if err := r.Client.List(ctx, list, client.MatchingLabels(vmsecret.ServerLabels(server))); err != nil {
		log.FromContext(ctx).Error(err, "list the credential Secrets of a BackupStorageLocationServer", "server", server)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		if vm := vmsecret.VM(&list.Items[i]); vm != "" {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: list.Items[i].Namespace, Name: vm}})
		}
	}
	return reqs
}

// Reconcile renders one VM's bootstrap again when its server publishes
// another endpoint or CA than it was rendered with.
func (r *BootstrapReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	secret, err := getCredentialSecret(ctx, r.Client, req.NamespacedName)
	if err != nil || secret == nil || !vmsecret.IsManaged(secret) {
		// None, or someone else's: not even its server is read.
		return ctrl.Result{}, err
	}
	secretKey := client.ObjectKeyFromObject(secret)
	vm, err := getVM(ctx, r.Client, req.NamespacedName)
	if err != nil {
		return ctrl.Result{}, err
	}
	bsls, err := r.server(ctx, vmsecret.Server(secret))
	if err != nil {
		return ctrl.Result{}, err
	}
	logger := log.FromContext(ctx).WithValues("secret", secretKey)
	if why, due := renderDue(vm, secret, bsls); !due {
		logger.V(2).Info("bootstrap left as it is", "why", why)
		return ctrl.Result{}, nil
	}
	// Paths and schedule come from the VM as stored: a cache behind it
	// would render what the webhook just replaced. The payload comes from
	// the Secret as stored too: the controller's cache holds none (see
	// internal/controller's TrimSecret).
	live, err := getVM(ctx, r.APIReader, req.NamespacedName)
	if err != nil {
		return ctrl.Result{}, err
	}
	if secret, err = getCredentialSecret(ctx, r.APIReader, req.NamespacedName); err != nil || secret == nil {
		return ctrl.Result{}, err // gone: nothing to render
	}
	rr := rerender(live, secret, bsls, r.Clock.Now())
	if rr.secret == nil {
		logger.V(1).Info("cache is behind the API server; bootstrap left as it is", "why", rr.why)
		return ctrl.Result{}, nil // the VM's or the Secret's update brings us back
	}
	// Exactly the version decided on: a Secret the webhook rewrote since
	// is decided again.
	if err := optimistic.Patch(ctx, r.Client, secret, func() { rr.secret.DeepCopyInto(secret) }); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return ctrl.Result{}, nil
		case apierrors.IsConflict(err):
			return ctrl.Result{RequeueAfter: retryConflict}, nil
		}
		return ctrl.Result{}, fmt.Errorf("render the bootstrap of Secret %s again: %w", secretKey, err)
	}
	if rr.event != "" {
		r.Recorder.Event(live, corev1.EventTypeNormal, ReasonBootstrapUpdated, rr.event)
	}
	logger.Info("bootstrap rendered again", "why", rr.why, "payloadChanged", rr.event != "")
	return ctrl.Result{}, nil
}

// server reads a BSLS; nil when there is none.
func (r *BootstrapReconciler) server(ctx context.Context, key types.NamespacedName) (*v1alpha1.BackupStorageLocationServer, error) {
	if key.Namespace == "" || key.Name == "" {
		return nil, nil //nolint:nilnil // no server named: rerender says so
	}
	bsls := &v1alpha1.BackupStorageLocationServer{}
	if err := r.Client.Get(ctx, key, bsls); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil //nolint:nilnil // an absent server is a state rerender handles
		}
		return nil, fmt.Errorf("get BackupStorageLocationServer %s: %w", key, err)
	}
	return bsls, nil
}

// rendering is what rerender decided.
type rendering struct {
	// secret is the Secret to write; nil when it stays as it is.
	secret *corev1.Secret
	// why it stays, or what changed.
	why string
	// event is the BootstrapUpdated message; "" when the payload's bytes
	// did not change (only the record of what it was rendered with did).
	event string
}

func leaveBootstrap(format string, args ...any) rendering {
	return rendering{why: fmt.Sprintf(format, args...)}
}

// rerender is the whole policy of the bootstrap reconciler: given a
// credential Secret, its VM's metadata (nil when there is no such VM) and
// the server the Secret is labelled for (nil when it does not exist), the
// Secret with its payload rendered again, or nothing. It renders only what
// renderDue says is due, of a VM that was injected with it; with the
// Secret's own credentials and
// generation, the placement the VM's status annotation records (the owner's
// merged part taken from the Secret byte for byte), and the paths and
// schedule of the VM's annotations, at time now.
func rerender(vm *metav1.PartialObjectMetadata, secret *corev1.Secret, bsls *v1alpha1.BackupStorageLocationServer, now time.Time) rendering {
	if why, due := renderDue(vm, secret, bsls); !due {
		return leaveBootstrap("%s", why)
	}
	endpoint, ca := bsls.Status.Endpoint, []byte(bsls.Status.TLSCA)
	kopiaClient := cloudinit.UsableClient(bsls.Status.Client)
	oldEndpoint, oldCA := vmsecret.Rendered(secret)
	oldClient := vmsecret.RenderedClient(secret)
	server := vmsecret.Server(secret)
	generation, ok := vmsecret.GenerationNumber(secret)
	if !ok || vmsecret.Password(secret) == "" {
		return leaveBootstrap("holds no credentials")
	}
	st, ok, err := vmsecret.ParseStatus(vm.Annotations)
	if err != nil || !ok || st.Secret != secret.Name || st.Server != server.String() || st.Generation != generation {
		// The webhook wrote the Secret for an admission whose VM is not
		// stored yet (or never will be): its status annotation says
		// what the payload is, once it is.
		return leaveBootstrap("the VirtualMachine's annotation %s does not describe this Secret's generation %d", v1alpha1.AnnotationStatus, generation)
	}
	p := cloudinit.Placement{Mode: st.Mode}
	switch {
	case st.Mode == v1alpha1.ModeDisk && secret.Data[vmsecret.KeyInstall] == nil,
		st.Mode == v1alpha1.ModeCloudInit && secret.Data[vmsecret.KeyUserData] == nil,
		st.Mode != v1alpha1.ModeDisk && st.Mode != v1alpha1.ModeCloudInit:
		return leaveBootstrap("its payload is not in mode %q as the VirtualMachine's annotation %s says", st.Mode, v1alpha1.AnnotationStatus)
	case st.Mode == v1alpha1.ModeCloudInit && st.MergedFrom != "":
		part, err := cloudinit.UserPart(secret.Data[vmsecret.KeyUserData])
		if err != nil {
			return leaveBootstrap("its user-data holds no part of the owner's: %v", err)
		}
		p.UserPart = part
	}
	paths, schedule, err := cloudinit.Schedule(vm.Annotations)
	if err != nil {
		return leaveBootstrap("%v", err)
	}
	s := secret.DeepCopy()
	guest := vmsecret.Guest{
		Username: vmsecret.Identity(secret), Password: vmsecret.Password(secret), Generation: generation,
		Paths: paths, Schedule: schedule,
	}
	if err := vmsecret.Render(s, bsls, guest, p, now); err != nil {
		return leaveBootstrap("cannot render with what BackupStorageLocationServer %s publishes: %v", server, err)
	}
	rr := rendering{secret: s, why: "rendered for the endpoint, CA and client the server publishes"}
	if maps.EqualFunc(secret.Data, s.Data, func(a, b []byte) bool { return string(a) == string(b) }) {
		return rr
	}
	var changed []string
	if oldEndpoint != endpoint {
		changed = append(changed, "URL "+endpoint)
	}
	if oldCA != vmsecret.CASum(ca) {
		changed = append(changed, "CA (SHA-256 "+vmsecret.CASum(ca)+")")
	}
	// The rendered client's digest, then what ClientDigest adds for requests.
	switch oldBase, _, _ := strings.Cut(oldClient, " "); {
	case oldBase != clientdist.Digest(kopiaClient) && kopiaClient != nil:
		changed = append(changed, "kopia client "+kopiaClient.Version)
	case oldBase != clientdist.Digest(kopiaClient):
		changed = append(changed, "no kopia client")
	case oldClient != vmsecret.ClientDigest(bsls) && requestsPolled(bsls):
		changed = append(changed, "requests polled every "+bsls.Status.RequestPollInterval.Duration.String())
	case oldClient != vmsecret.ClientDigest(bsls):
		changed = append(changed, "no requests")
	}
	what := "a new " + strings.Join(changed, " and ")
	if oldEndpoint == "" && oldCA == "" {
		// Written before Secrets recorded it (an earlier release).
		what = strings.Join(changed, " and ") + ", which the bootstrap did not record being rendered with"
	}
	rr.why = "the server publishes " + what
	rr.event = fmt.Sprintf("BackupStorageLocationServer %s publishes %s: the bootstrap in Secret %s is rendered again with it (same credentials, generation %d, %s mode); the guest gets it at its next start",
		server, what, secret.Name, generation, st.Mode)
	return rr
}

// renderDue says whether a credential Secret's bootstrap is due to be
// rendered again, and why not: from its metadata alone (the controller's
// cache holds no payload), it must be guestbackup's Secret of a VM that
// controls it and names its server, which publishes an endpoint and a CA
// other than (or a client other than) those it was rendered with.
func renderDue(vm *metav1.PartialObjectMetadata, secret *corev1.Secret, bsls *v1alpha1.BackupStorageLocationServer) (why string, due bool) {
	server := vmsecret.Server(secret)
	leave := func(format string, args ...any) (string, bool) { return fmt.Sprintf(format, args...), false }
	switch {
	case !vmsecret.IsManaged(secret):
		return leave("not labelled %s=%s", vmsecret.LabelManagedBy, vmsecret.ManagedByValue)
	case !secret.DeletionTimestamp.IsZero():
		return leave("being deleted")
	case !vmsecret.IsNamedFor(secret):
		return leave("label %s does not name the VM the Secret is named after", vmsecret.LabelVM)
	case vm == nil:
		return leave("no VirtualMachine %s", vmsecret.VM(secret))
	case !vmsecret.ControlledBy(secret, vm.Name, vm.UID):
		return leave("not controlled by VirtualMachine %s (yet)", vm.Name)
	case !vm.DeletionTimestamp.IsZero():
		return leave("the VirtualMachine is being deleted")
	case vm.Annotations[v1alpha1.AnnotationServer] != server.String():
		return leave("the VirtualMachine's annotation %s does not name %s", v1alpha1.AnnotationServer, server)
	case bsls == nil || client.ObjectKeyFromObject(bsls) != server:
		return leave("BackupStorageLocationServer %s does not exist", server)
	case bsls.Status.Endpoint == "" || bsls.Status.TLSCA == "":
		return leave("BackupStorageLocationServer %s publishes no endpoint or no CA", server)
	}
	endpoint, ca := bsls.Status.Endpoint, []byte(bsls.Status.TLSCA)
	oldEndpoint, oldCA := vmsecret.Rendered(secret)
	if oldEndpoint == endpoint && oldCA == vmsecret.CASum(ca) && vmsecret.RenderedClient(secret) == vmsecret.ClientDigest(bsls) {
		return leave("rendered with the server's endpoint, CA, client and request poll")
	}
	return "", true
}

// requestsPolled reports whether bsls's guests poll for requests.
func requestsPolled(bsls *v1alpha1.BackupStorageLocationServer) bool {
	return vmsecret.ClientDigest(bsls) != clientdist.Digest(cloudinit.UsableClient(bsls.Status.Client))
}
