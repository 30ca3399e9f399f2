package requeststatus

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The controller's rules for requests, alone in the ClusterRole the chart
// installs with their API (requests.enabled): reading the activity
// ConfigMaps, VMs, BSLSs and Namespaces and recording Events are the
// controller's anyway (packages audit's and kopiaserver's rules).
// +kubebuilder:rbac:groups=guestbackup.io,resources=guestsnapshots,verbs=get;list;watch
// +kubebuilder:rbac:groups=guestbackup.io,resources=guestsnapshots/status,verbs=patch

// uidIndex indexes GuestSnapshots by UID: a guest's result names its
// request by UID alone.
const uidIndex = "metadata.uid"

// vmIndex indexes GuestSnapshots by their VM's name: a VM that goes fails
// its requests.
const vmIndex = "spec.vm"

// Reconciler keeps each GuestSnapshot's status.
type Reconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// Clock tells the time; default (SetupWithManager): the real clock.
	Clock clock.PassiveClock
}

// SetupWithManager registers the reconciler: GuestSnapshots, and the
// activity ConfigMaps, mapped to the requests their guests answered.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorderFor("guestbackup-requests")
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.GuestSnapshot{}, uidIndex, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return fmt.Errorf("index GuestSnapshots by UID: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.GuestSnapshot{}, vmIndex, func(o client.Object) []string {
		return []string{o.(*v1alpha1.GuestSnapshot).Spec.VM}
	}); err != nil {
		return fmt.Errorf("index GuestSnapshots by VM: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("guestsnapshot").
		For(&v1alpha1.GuestSnapshot{}).
		// A VM deleted or opted out fails its requests (metadata only,
		// the cache the other VM reconcilers share).
		Watches(&kubevirtv1.VirtualMachine{}, handler.EnqueueRequestsFromMapFunc(r.requestsOfVM), builder.OnlyMetadata).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.answered),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return o.GetLabels()[activity.Label] != ""
			}))).
		Complete(r)
}

// requestsOfVM maps a VM to its requests that have not ended.
func (r *Reconciler) requestsOfVM(ctx context.Context, o client.Object) []reconcile.Request {
	list := &v1alpha1.GuestSnapshotList{}
	if err := r.Client.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{vmIndex: o.GetName()}); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if !ended(list.Items[i].Status.Phase) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// answered maps an activity ConfigMap to the requests its guests answered.
func (r *Reconciler) answered(ctx context.Context, o client.Object) []reconcile.Request {
	cm, ok := o.(*corev1.ConfigMap)
	if !ok {
		return nil
	}
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, g := range guests {
		for _, res := range g.Results {
			list := &v1alpha1.GuestSnapshotList{}
			if err := r.Client.List(ctx, list, client.MatchingFields{uidIndex: res.UID}); err != nil {
				continue
			}
			for _, s := range list.Items {
				// Only a request of the VM the result's guest is: a
				// server lists the results of its own users.
				if identity.OfVM(s.Spec.VM, s.Namespace) == g.User {
					reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&s)})
				}
			}
		}
	}
	return reqs
}

// Reconcile brings one GuestSnapshot's status up to date.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	s := &v1alpha1.GuestSnapshot{}
	if err := r.Client.Get(ctx, req.NamespacedName, s); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ended(s.Status.Phase) {
		return ctrl.Result{}, nil
	}
	in := Inputs{Snapshot: s, Now: r.Clock.Now()}
	vm := &metav1.PartialObjectMetadata{}
	vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Spec.VM}, vm); {
	case err == nil:
		in.VM = vm
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, fmt.Errorf("get VirtualMachine %s/%s: %w", s.Namespace, s.Spec.VM, err)
	}
	if in.VM != nil {
		if err := r.serverOf(ctx, &in); err != nil {
			return ctrl.Result{}, err
		}
	}
	if in.Server != nil && in.Admitted {
		g, err := r.guestOf(ctx, in.VM, in.Server)
		if err != nil {
			return ctrl.Result{}, err
		}
		in.Guest = g
	}
	d := Decide(in)
	if equality.Semantic.DeepEqual(d.Status, s.Status) {
		return ctrl.Result{}, nil
	}
	orig := s.DeepCopy()
	s.Status = d.Status
	if err := r.Client.Status().Patch(ctx, s, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("update status of GuestSnapshot %s: %w", req.NamespacedName, err)
	}
	// After the status: a failed write records nothing, and the next
	// pass, which decides again from the same inputs, announces it once.
	for _, e := range d.Events {
		r.Recorder.Event(s, e.Type, e.Reason, e.Message)
		if in.VM != nil {
			ev := vmevent.Normal(e.Reason, e.Message)
			if e.Type == corev1.EventTypeWarning {
				ev = vmevent.Warning(e.Reason, e.Message)
			}
			vmevent.Record(r.Recorder, in.VM.ObjectMeta, []vmevent.Event{ev})
		}
	}
	return ctrl.Result{}, nil
}

// serverOf reads the BSLS the VM's annotation names into in.Server, and
// whether it admits the request's namespace.
func (r *Reconciler) serverOf(ctx context.Context, in *Inputs) error {
	ref, err := vmsecret.ParseServerRef(in.VM.Annotations[v1alpha1.AnnotationServer])
	if err != nil {
		return nil // Decide says what is wrong with the annotation
	}
	server := &v1alpha1.BackupStorageLocationServer{}
	if err := r.Client.Get(ctx, ref, server); err != nil {
		return client.IgnoreNotFound(err)
	}
	in.Server = server
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: in.Snapshot.Namespace}, ns); err != nil {
		return fmt.Errorf("get namespace %s: %w", in.Snapshot.Namespace, err)
	}
	in.Admitted, err = kopiaserver.Admits(server, ns)
	return err
}

// guestOf reads the activity server published for the VM's guest; nil
// when there is none (yet). Only the server's own activity ConfigMap
// counts (controlled by the BSLS): a tenant who points a VM's annotation
// at a namespace of theirs can write ConfigMaps there, labels and all.
func (r *Reconciler) guestOf(ctx context.Context, vm *metav1.PartialObjectMetadata, server *v1alpha1.BackupStorageLocationServer) (*activity.Guest, error) {
	user := identity.OfVM(vm.Name, vm.Namespace)
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: server.Namespace, Name: activity.ConfigMapName(server.Name, userset.ShardOf(user))}
	if err := r.Client.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get activity ConfigMap %s: %w", key, err)
	}
	if !metav1.IsControlledBy(cm, server) {
		return nil, nil
	}
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	if err != nil {
		return nil, fmt.Errorf("activity ConfigMap %s: %w", key, err)
	}
	g, ok := guests[user]
	if !ok {
		return nil, nil
	}
	return &g, nil
}
