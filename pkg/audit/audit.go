// Package audit records on each VirtualMachine what its guest does with
// its backups, from the activity its server publishes (package activity):
// when it first backed up, each new snapshot, and when backups stopped or
// resumed. An admin answers "does this VM back up?" from `kubectl describe
// vm` and from the metrics.
package audit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/optimistic"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Event reasons on a VM.
const (
	ReasonGuestConnected  = "GuestConnected"
	ReasonSnapshotCreated = "SnapshotCreated"
	ReasonBackupStale     = "BackupStale"
	ReasonBackupResumed   = "BackupResumed"
	// ReasonGuestNotConnected: a running VM with paths has no snapshot on
	// its server NotConnectedAfter after its instance started, and never
	// had one: its guest has never connected (GuestConnected follows when
	// it does).
	ReasonGuestNotConnected = "GuestNotConnected"
)

// Annotations on the VM's credential Secret: what was announced, so that
// a resync or a restart repeats no Event. The contract (pkg/vmsecret)
// names them; the audit is their writer.
const (
	AnnotationLastSnapshot = vmsecret.AnnotationLastSnapshot
	AnnotationBackupStale  = vmsecret.AnnotationBackupStale
	AnnotationNotConnected = vmsecret.AnnotationNotConnected
)

// DefaultStaleAfter is how long a VM whose schedule has no fixed period
// may go without a snapshot before BackupStale.
const DefaultStaleAfter = 48 * time.Hour

// DefaultNotConnectedAfter is how long a running VM's guest may take to
// connect after its instance started before GuestNotConnected: a guest
// boots in a minute or two, and its connect service retries for about
// half an hour, backing off to a minute between attempts.
const DefaultNotConnectedAfter = 15 * time.Minute

// Reconciler is keyed by VM. It reads the VM's guest from its server's
// activity ConfigMap, and records on the VM what is new.
type Reconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// StaleAfter applies to schedules without a fixed period; default
	// DefaultStaleAfter.
	StaleAfter time.Duration
	// NotConnectedAfter is how long after its instance started a running
	// VM's guest may take to connect; default DefaultNotConnectedAfter.
	NotConnectedAfter time.Duration
	// Clock tells the time; default (SetupWithManager): the real clock.
	Clock clock.PassiveClock

	shards shards
}

// SetupWithManager registers the reconciler: VMs (metadata only), their
// instances (an instance's creation and deletion are its start and stop)
// and the activity ConfigMaps, mapped to the VMs whose guests they list.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorderFor("guestbackup-audit")
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("guest-activity").
		For(&kubevirtv1.VirtualMachine{}, builder.OnlyMetadata).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(vmsOfActivity),
			builder.WithPredicates(predicate.NewPredicateFuncs(IsServersActivity))).
		// An instance bears its VM's name; its status updates pass none.
		// Watched whole, not as metadata: the credential hasher watches
		// instances whole, and one informer (trimmed to what either
		// reads, internal/controller.TrimInstance) holds them once
		// where two would hold every instance's metadata twice.
		Watches(&kubevirtv1.VirtualMachineInstance{}, &handler.EnqueueRequestForObject{},
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }})).
		// A VM's GuestProtection bears its name: one deleted, or written
		// by anyone but the controller, is made right again. The
		// controller's own writes come back as one more pass that finds
		// nothing to write.
		Watches(&v1alpha1.GuestProtection{}, &handler.EnqueueRequestForObject{}).
		Complete(r)
}

// serverKind is the kind that controls the activity ConfigMaps.
var serverKind = v1alpha1.GroupVersion.WithKind("BackupStorageLocationServer").GroupKind()

// IsServersActivity is whether o is an activity ConfigMap controlled by
// the BSLS it is labelled for, as the BSLS reconciler creates them. Any
// other is not worth decoding, however it is labelled: guest believes
// none but a server's own, and neither does the BackupClient reconciler.
func IsServersActivity(o client.Object) bool {
	server := o.GetLabels()[activity.Label]
	if server == "" {
		return false
	}
	ref := metav1.GetControllerOfNoCopy(o)
	if ref == nil || ref.Kind != serverKind.Kind || ref.Name != server {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == serverKind.Group
}

// vmsOfActivity maps an activity ConfigMap to the VMs of its guests: a
// Kopia user <vm>@<namespace> is that VM.
func vmsOfActivity(_ context.Context, o client.Object) []reconcile.Request {
	cm, ok := o.(*corev1.ConfigMap)
	if !ok {
		return nil
	}
	d, err := decodeShard(cm)
	if err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(d.guests))
	for _, users := range [][]string{slices.Collect(maps.Keys(d.guests)), d.catalogues.Users()} {
		for _, user := range users {
			if vm, ns, ok := strings.Cut(user, "@"); ok {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: vm}})
			}
		}
	}
	return reqs
}

// Reconcile records what is new about one VM's guest.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vm := &metav1.PartialObjectMetadata{}
	vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	if err := r.Client.Get(ctx, req.NamespacedName, vm); err != nil {
		if apierrors.IsNotFound(err) {
			exported.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if vm.Annotations[v1alpha1.AnnotationServer] == "" {
		exported.forget(req.NamespacedName)
		return ctrl.Result{}, r.unprotect(ctx, req.NamespacedName)
	}
	secret := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vmsecret.Name(vm.Name)}, secret); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !vmsecret.IsManaged(secret) || vmsecret.VM(secret) != vm.Name {
		return ctrl.Result{}, nil
	}
	// The VM's identity, from facts: what its Secret's data says is the
	// guest's, not the audit's.
	user := identity.OfVM(vm.Name, vm.Namespace)
	bsls := vmsecret.Server(secret)
	server, err := r.server(ctx, bsls)
	if err != nil {
		return ctrl.Result{}, err
	}
	guest, err := r.guest(ctx, server, user)
	if err != nil {
		return ctrl.Result{}, err
	}
	recent, err := r.catalogue(ctx, server, user)
	if err != nil {
		return ctrl.Result{}, err
	}
	inst, err := r.instance(ctx, req.NamespacedName)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := r.Clock.Now()
	d := Decide(vm.Annotations, secret.Annotations, guest, vmsecret.IssuedAt(secret), now, r.staleAfter())
	c := DecideConnection(Connection{
		VMAnnotations: vm.Annotations, Announced: secret.Annotations, Guest: guest, Instance: inst,
		Issued: vmsecret.IssuedAt(secret), User: user, Server: bsls.String(), Now: now, After: r.notConnectedAfter(),
	})
	d.merge(c)
	notConnected := inst != nil && announcedAfter(secret.Annotations, d.Annotations, AnnotationNotConnected) == string(inst.UID)
	exported.set(req.NamespacedName, bsls.String(), notConnected, guest)
	if len(d.Annotations) > 0 {
		// Recorded before the Events are made: a lost process costs an
		// Event, the other order would repeat one.
		err := optimistic.Patch(ctx, r.Client, secret, func() {
			if secret.Annotations == nil {
				secret.Annotations = map[string]string{}
			}
			for k, v := range d.Annotations {
				if v == "" {
					delete(secret.Annotations, k)
				} else {
					secret.Annotations[k] = v
				}
			}
		})
		if err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			return ctrl.Result{}, fmt.Errorf("record activity on Secret %s/%s: %w", secret.Namespace, secret.Name, err)
		}
	}
	vmevent.Record(r.Recorder, vm.ObjectMeta, d.Events)
	if err := r.protect(ctx, vm, ProtectionInputs{
		Server: bsls.String(), Identity: user, Guest: guest, Recent: recent, NotConnected: notConnected,
		Stale: announcedAfter(secret.Annotations, d.Annotations, AnnotationBackupStale) != "", Now: now,
	}); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: d.RecheckAfter}, nil
}

func (r *Reconciler) notConnectedAfter() time.Duration {
	if r.NotConnectedAfter > 0 {
		return r.NotConnectedAfter
	}
	return DefaultNotConnectedAfter
}

// instance reads the VM's running instance; nil when it runs none.
func (r *Reconciler) instance(ctx context.Context, key types.NamespacedName) (*Instance, error) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := r.Client.Get(ctx, key, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil //nolint:nilnil // a VM that runs no instance
		}
		return nil, fmt.Errorf("get VirtualMachineInstance %s: %w", key, err)
	}
	if vmi.DeletionTimestamp != nil {
		return nil, nil //nolint:nilnil // a stopping instance waits for no guest
	}
	return &Instance{UID: vmi.UID, Started: vmi.CreationTimestamp.Time}, nil
}

// announcedAfter is an annotation's value once changes are applied.
func announcedAfter(announced, changes map[string]string, key string) string {
	if v, ok := changes[key]; ok {
		return v
	}
	return announced[key]
}

func (r *Reconciler) staleAfter() time.Duration {
	if r.StaleAfter > 0 {
		return r.StaleAfter
	}
	return DefaultStaleAfter
}

// guest reads a user's activity from its server's ConfigMap; nil when the
// server has published none for it.
func (r *Reconciler) guest(ctx context.Context, server *v1alpha1.BackupStorageLocationServer, user string) (*activity.Guest, error) {
	if server == nil {
		return nil, nil
	}
	d, err := r.published(ctx, server, activity.ConfigMapName(server.Name, userset.ShardOf(user)))
	if d == nil || err != nil {
		return nil, err
	}
	if g, ok := d.guests[user]; ok {
		return &g, nil
	}
	return nil, nil
}

// catalogue reads a user's catalogue from its server's ConfigMap; nil when
// the server has published none for it.
func (r *Reconciler) catalogue(ctx context.Context, server *v1alpha1.BackupStorageLocationServer, user string) ([]activity.Snapshot, error) {
	if server == nil {
		return nil, nil
	}
	d, err := r.published(ctx, server, activity.CatalogueConfigMapName(server.Name, activity.CatalogueShardOf(user)))
	if d == nil || err != nil {
		return nil, err
	}
	return d.catalogues.Of(user)
}

// server reads the BSLS a credential Secret names; nil when it names none
// or none of that name exists.
func (r *Reconciler) server(ctx context.Context, bsls types.NamespacedName) (*v1alpha1.BackupStorageLocationServer, error) {
	if bsls.Namespace == "" || bsls.Name == "" {
		return nil, nil
	}
	server := &v1alpha1.BackupStorageLocationServer{}
	if err := r.Client.Get(ctx, bsls, server); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get BackupStorageLocationServer %s: %w", bsls, err)
	}
	return server, nil
}

// published reads ConfigMap name, which server publishes its guests in,
// decoded; nil when there is none. Only the server's own ConfigMap
// counts, the one its BSLS controls: the credential Secret names the
// server by labels, and a tenant who can write such a Secret (the chart's
// secretPolicy off) can name a namespace of hers, where she writes
// ConfigMaps, labels and all.
func (r *Reconciler) published(ctx context.Context, server *v1alpha1.BackupStorageLocationServer, name string) (*decodedShard, error) {
	bsls := client.ObjectKeyFromObject(server)
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: bsls.Namespace, Name: name}
	if err := r.Client.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			r.shards.forget(key)
			return nil, nil
		}
		return nil, fmt.Errorf("get activity ConfigMap %s: %w", key, err)
	}
	if !metav1.IsControlledBy(cm, server) {
		// Said to the admin: until the BSLS's reconciler adopts a
		// ConfigMap nothing controls (restored before its BSLS, say), or
		// for good when another object controls it, every guest of its
		// shard is hidden.
		log.FromContext(ctx).Info("activity ConfigMap not controlled by its BackupStorageLocationServer: ignored; one nothing controls is adopted at the BackupStorageLocationServer's next reconcile, another is created again, controlled, once deleted",
			"configMap", key, "backupStorageLocationServer", bsls)
		return nil, nil
	}
	d, err := r.shards.decode(key, cm)
	if err != nil {
		log.FromContext(ctx).Error(err, "activity ConfigMap unreadable", "configMap", key)
		return nil, nil
	}
	return d, nil
}

// shards remembers each ConfigMap a server publishes its guests in,
// decoded, by its version: every VM of a shard reads the same ConfigMap (a
// server's guests over 16), so decoding it for each VM made a restart's
// audit quadratic in the guests (88 ms a VM with 10,000 of them: make
// bench, BenchmarkOptedInVMs). A server pod rewrites it once a scan at
// most.
type shards struct {
	mu      sync.Mutex
	decoded map[types.NamespacedName]*decodedShard
}

// decodedShard is what one ConfigMap publishes: the guests' activity
// (activity.Key), decoded, or their catalogues (activity.CatalogueKey),
// indexed.
type decodedShard struct {
	version    string
	guests     map[string]activity.Guest
	catalogues *activity.CatalogueIndex
}

// decodeShard decodes what cm publishes.
func decodeShard(cm *corev1.ConfigMap) (*decodedShard, error) {
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		return nil, err
	}
	catalogues, err := activity.IndexCatalogues(cm.Data[activity.CatalogueKey])
	if err != nil {
		return nil, err
	}
	return &decodedShard{version: cm.ResourceVersion, guests: guests, catalogues: catalogues}, nil
}

// decode is what ConfigMap cm, key, publishes: decoded when cm is a
// version it has not decoded yet. What it returns is shared: read it
// only.
func (s *shards) decode(key types.NamespacedName, cm *corev1.ConfigMap) (*decodedShard, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.decoded[key]; ok && d.version == cm.ResourceVersion && cm.ResourceVersion != "" {
		return d, nil
	}
	d, err := decodeShard(cm)
	if err != nil {
		return nil, err
	}
	if s.decoded == nil {
		s.decoded = map[types.NamespacedName]*decodedShard{}
	}
	s.decoded[key] = d
	return d, nil
}

// forget drops what was decoded of a ConfigMap that is gone.
func (s *shards) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.decoded, key)
}

// Decision is what is new about a VM's guest.
type Decision struct {
	Events []vmevent.Event
	// Annotations to set on the credential Secret ("" removes one).
	Annotations map[string]string
	// RecheckAfter is when staleness must be looked at again; 0: never.
	RecheckAfter time.Duration
}

// merge adds o's Events and annotations to d, and keeps the sooner recheck.
func (d *Decision) merge(o Decision) {
	d.Events = append(d.Events, o.Events...)
	for k, v := range o.Annotations {
		d.Annotations[k] = v
	}
	if o.RecheckAfter > 0 && (d.RecheckAfter == 0 || o.RecheckAfter < d.RecheckAfter) {
		d.RecheckAfter = o.RecheckAfter
	}
}

// Period is how often a guest with this schedule snapshots, for the
// calendar shorthands systemd documents; 0 for other expressions.
func Period(schedule string) time.Duration {
	switch strings.TrimSpace(schedule) {
	case "", "daily":
		return 24 * time.Hour
	case "hourly":
		return time.Hour
	case "weekly":
		return 7 * 24 * time.Hour
	case "monthly":
		return 31 * 24 * time.Hour
	}
	return 0
}

// SnapshotCreatedMessage is the SnapshotCreated Event's message for guest's
// newest snapshot: on a VM, and on a BackupClient (package backupclient).
func SnapshotCreatedMessage(guest *activity.Guest) string {
	return fmt.Sprintf("Snapshot %s of %s: %d bytes in %d files, taken in %s, ended %s; snapshots kept: %d",
		guest.Last.ID, guest.Last.Path, guest.Last.Bytes, guest.Last.Files,
		guest.Last.End.Sub(guest.Last.Start).Round(time.Millisecond), guest.Last.End.UTC().Format(time.RFC3339), guest.Snapshots)
}

// Decide compares a guest's activity with what was announced. Only the
// newest snapshot is reported: several between two looks are one Event,
// and the count is in the metrics. A VM with paths is stale when it has
// no snapshot within twice its schedule's period (staleAfter when the
// schedule has none), counted from its last snapshot or, before any,
// from when its credentials were issued.
func Decide(vmAnnotations, announced map[string]string, guest *activity.Guest, issued, now time.Time, staleAfter time.Duration) Decision {
	d := Decision{Annotations: map[string]string{}}
	if guest != nil {
		decideReport(&d, announced, guest.Report)
	}
	stale := announced[AnnotationBackupStale] == "true"
	last := issued
	if guest != nil && guest.Last.ID != "" {
		last = guest.Last.End
		if guest.Last.ID != announced[AnnotationLastSnapshot] {
			if announced[AnnotationLastSnapshot] == "" {
				d.Events = append(d.Events, vmevent.Normal(ReasonGuestConnected,
					fmt.Sprintf("Guest backs up as %s: first snapshot at %s", guest.User, guest.First.UTC().Format(time.RFC3339))))
			}
			d.Events = append(d.Events, vmevent.Normal(ReasonSnapshotCreated, SnapshotCreatedMessage(guest)))
			d.Annotations[AnnotationLastSnapshot] = guest.Last.ID
			if stale {
				d.Events = append(d.Events, vmevent.Normal(ReasonBackupResumed,
					fmt.Sprintf("Backups resumed: snapshot of %s at %s", guest.Last.Path, guest.Last.End.UTC().Format(time.RFC3339))))
				d.Annotations[AnnotationBackupStale] = ""
				stale = false
			}
		}
	}
	if vmAnnotations[v1alpha1.AnnotationPaths] == "" {
		return d // the guest only connects: nothing is expected of it
	}
	window := 2 * Period(vmAnnotations[v1alpha1.AnnotationSchedule])
	if window == 0 {
		window = staleAfter
	}
	deadline := last.Add(window)
	if now.Before(deadline) {
		d.RecheckAfter = deadline.Sub(now)
		return d
	}
	if !stale {
		since := "its credentials were issued at " + issued.UTC().Format(time.RFC3339)
		if guest != nil && guest.Last.ID != "" {
			since = "the last one, at " + last.UTC().Format(time.RFC3339)
		}
		d.Events = append(d.Events, vmevent.Warning(ReasonBackupStale,
			fmt.Sprintf("No snapshot of %s within %s since %s: look in the guest at journalctl -u guestbackup-snapshot and /var/lib/guestbackup/status",
				vmAnnotations[v1alpha1.AnnotationPaths], window, since)))
		d.Annotations[AnnotationBackupStale] = "true"
	}
	return d
}

// Instance is a VM's running instance, as the audit sees it.
type Instance struct {
	// UID tells one start of the VM from the next.
	UID types.UID
	// Started is when the instance was created: the VM's start.
	Started time.Time
}

// Connection is what DecideConnection looks at.
type Connection struct {
	VMAnnotations, Announced map[string]string
	// Guest is the server's record of the guest; nil when it has none.
	Guest *activity.Guest
	// Instance is the VM's running instance; nil when it runs none.
	Instance *Instance
	// Issued is when the VM's credentials were issued.
	Issued time.Time
	// User and Server name the guest's identity and BSLS in the message.
	User, Server string
	Now          time.Time
	// After is how long a guest may take to connect after its start.
	After time.Duration
}

// DecideConnection warns, once per instance, about a running VM whose
// guest has never connected. The server records a guest only by what it
// writes: a guest with paths snapshots right after it connects, so its
// first snapshot is the evidence (and GuestConnected, decided by Decide,
// says it arrived); a guest without paths writes nothing the server
// keeps, so it is never judged. The clock starts when the instance was
// created, so a VM stopped before its guest connected is warned about
// again at its next start, and one running for longer than After since
// before the controller started is warned about at once.
func DecideConnection(c Connection) Decision {
	d := Decision{Annotations: map[string]string{}}
	warned := c.Announced[AnnotationNotConnected]
	connected := c.Announced[AnnotationLastSnapshot] != "" || (c.Guest != nil && c.Guest.Last.ID != "")
	if connected || c.VMAnnotations[v1alpha1.AnnotationPaths] == "" {
		if warned != "" {
			d.Annotations[AnnotationNotConnected] = ""
		}
		return d
	}
	if c.Instance == nil || warned == string(c.Instance.UID) {
		return d
	}
	deadline := c.Instance.Started.Add(c.After)
	if c.Now.Before(deadline) {
		d.RecheckAfter = deadline.Sub(c.Now)
		return d
	}
	causes := ""
	if c.Issued.After(c.Instance.Started) {
		// KubeVirt reads the cloud-init Secret when an instance starts.
		causes = fmt.Sprintf("this instance started before its credentials were issued at %s, so its guest has none: restart the VM; ", c.Issued.UTC().Format(time.RFC3339))
	}
	d.Events = append(d.Events, vmevent.Warning(ReasonGuestNotConnected, fmt.Sprintf(
		"The guest has not connected to BackupStorageLocationServer %s as %s within %s of the VM's start at %s (the server holds no snapshot of it). "+
			"Likely causes: %sthe guest cannot reach the server's URL (network, NetworkPolicy, the BackupStorageLocationServer's clientURL); "+
			"the guest did not run guestbackup's bootstrap (no cloud-init NoCloud support, or disk mode without guestbackup's disk unit); "+
			"kopia is missing in the guest; the guest has no systemd. Look in the guest at /var/lib/guestbackup/status and journalctl -u guestbackup-connect",
		c.Server, c.User, c.After, c.Instance.Started.UTC().Format(time.RFC3339), causes)))
	d.Annotations[AnnotationNotConnected] = string(c.Instance.UID)
	return d
}
