// Package audit records on each VirtualMachine what its guest does with
// its backups, from the activity its server publishes (package activity):
// when it first backed up, each new snapshot, and when backups stopped or
// resumed. An admin answers "does this VM back up?" from `kubectl describe
// vm` and from the metrics.
package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Event reasons on a VM.
const (
	ReasonGuestConnected  = "GuestConnected"
	ReasonSnapshotCreated = "SnapshotCreated"
	ReasonBackupStale     = "BackupStale"
	ReasonBackupResumed   = "BackupResumed"
)

// Annotations on the VM's credential Secret: what was announced, so that
// a resync or a restart repeats no Event. The contract (pkg/vmsecret)
// names them; the audit is their writer.
const (
	AnnotationLastSnapshot = vmsecret.AnnotationLastSnapshot
	AnnotationBackupStale  = vmsecret.AnnotationBackupStale
)

// DefaultStaleAfter is how long a VM whose schedule has no fixed period
// may go without a snapshot before BackupStale.
const DefaultStaleAfter = 48 * time.Hour

var (
	lastSnapshotTime = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_vm_last_snapshot_timestamp_seconds",
		Help: "When a VM's newest snapshot ended (Unix time).",
	}, []string{"namespace", "vm", "bsls"})
	lastSnapshotBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_vm_last_snapshot_bytes",
		Help: "Size of the files in a VM's newest snapshot.",
	}, []string{"namespace", "vm", "bsls"})
	snapshotsTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_vm_snapshots",
		Help: "Snapshots a VM has in its server's repository.",
	}, []string{"namespace", "vm", "bsls"})
)

func init() {
	metrics.Registry.MustRegister(lastSnapshotTime, lastSnapshotBytes, snapshotsTotal)
}

// Reconciler is keyed by VM. It reads the VM's guest from its server's
// activity ConfigMap, and records on the VM what is new.
type Reconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// StaleAfter applies to schedules without a fixed period; default
	// DefaultStaleAfter.
	StaleAfter time.Duration
	// Clock tells the time; nil means the real clock.
	Clock clock.PassiveClock
}

func (r *Reconciler) now() time.Time {
	if r.Clock != nil {
		return r.Clock.Now()
	}
	return clock.RealClock{}.Now()
}

// SetupWithManager registers the reconciler: VMs (metadata only) and the
// activity ConfigMaps, mapped to the VMs whose guests they list.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
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
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return o.GetLabels()[activity.Label] != ""
			}))).
		Complete(r)
}

// vmsOfActivity maps an activity ConfigMap to the VMs of its guests: a
// Kopia user <vm>@<namespace> is that VM.
func vmsOfActivity(_ context.Context, o client.Object) []reconcile.Request {
	cm, ok := o.(*corev1.ConfigMap)
	if !ok {
		return nil
	}
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(guests))
	for user := range guests {
		if vm, ns, ok := strings.Cut(user, "@"); ok {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: vm}})
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
			forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if vm.Annotations[v1alpha1.AnnotationServer] == "" {
		forget(req.NamespacedName)
		return ctrl.Result{}, nil
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
	guest, err := r.guest(ctx, bsls, user)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := Decide(vm.Annotations, secret.Annotations, guest, vmsecret.IssuedAt(secret), r.now(), r.staleAfter())
	if guest != nil {
		labels := prometheus.Labels{"namespace": vm.Namespace, "vm": vm.Name, "bsls": bsls.String()}
		snapshotsTotal.With(labels).Set(float64(guest.Snapshots))
		if guest.Last.ID != "" {
			lastSnapshotTime.With(labels).Set(float64(guest.Last.End.Unix()))
			lastSnapshotBytes.With(labels).Set(float64(guest.Last.Bytes))
		}
	}
	if len(d.Annotations) > 0 {
		// Recorded before the Events are made: a lost process costs an
		// Event, the other order would repeat one.
		patch := client.MergeFromWithOptions(secret.DeepCopy(), client.MergeFromWithOptimisticLock{})
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
		if err := r.Client.Patch(ctx, secret, patch); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			return ctrl.Result{}, fmt.Errorf("record activity on Secret %s/%s: %w", secret.Namespace, secret.Name, err)
		}
	}
	vmevent.Record(r.Recorder, vm.ObjectMeta, d.Events)
	return ctrl.Result{RequeueAfter: d.RecheckAfter}, nil
}

func (r *Reconciler) staleAfter() time.Duration {
	if r.StaleAfter > 0 {
		return r.StaleAfter
	}
	return DefaultStaleAfter
}

// guest reads a user's activity from its server's ConfigMap; nil when the
// server has published none for it.
func (r *Reconciler) guest(ctx context.Context, bsls types.NamespacedName, user string) (*activity.Guest, error) {
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: bsls.Namespace, Name: activity.ConfigMapName(bsls.Name, userset.ShardOf(user))}
	if err := r.Client.Get(ctx, key, cm); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		log.FromContext(ctx).Error(err, "activity ConfigMap unreadable", "configMap", key)
		return nil, nil
	}
	if g, ok := guests[user]; ok {
		return &g, nil
	}
	return nil, nil
}

func forget(vm types.NamespacedName) {
	for _, g := range []*prometheus.GaugeVec{lastSnapshotTime, lastSnapshotBytes, snapshotsTotal} {
		g.DeletePartialMatch(prometheus.Labels{"namespace": vm.Namespace, "vm": vm.Name})
	}
}

// Decision is what is new about a VM's guest.
type Decision struct {
	Events []vmevent.Event
	// Annotations to set on the credential Secret ("" removes one).
	Annotations map[string]string
	// RecheckAfter is when staleness must be looked at again; 0: never.
	RecheckAfter time.Duration
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
			d.Events = append(d.Events, vmevent.Normal(ReasonSnapshotCreated,
				fmt.Sprintf("Snapshot %s of %s: %d bytes in %d files, taken in %s, ended %s; snapshots kept: %d",
					guest.Last.ID, guest.Last.Path, guest.Last.Bytes, guest.Last.Files,
					guest.Last.End.Sub(guest.Last.Start).Round(time.Millisecond), guest.Last.End.UTC().Format(time.RFC3339), guest.Snapshots)))
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
