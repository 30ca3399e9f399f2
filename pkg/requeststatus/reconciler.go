package requeststatus

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
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
// +kubebuilder:rbac:groups=guestbackup.io,resources=guestsnapshots;guestrestores,verbs=get;list;watch
// +kubebuilder:rbac:groups=guestbackup.io,resources=guestsnapshots/status;guestrestores/status,verbs=patch

// uidIndex indexes requests by UID: a guest's result names its request by
// UID alone.
const uidIndex = "metadata.uid"

// vmIndex indexes requests by their VM's name: a VM that goes fails its
// requests.
const vmIndex = "spec.vm"

// Reconciler keeps each GuestSnapshot's and GuestRestore's status.
type Reconciler struct {
	Client client.Client
	// APIReader reads what the cache does not hold; default
	// (SetupWithManager): the manager's.
	APIReader client.Reader
	Recorder  record.EventRecorder
	// Image is the image restore Jobs run (guestbackup-restore and
	// kopia): the server pods'.
	Image string
	// Clock tells the time; default (SetupWithManager): the real clock.
	Clock clock.PassiveClock
}

// kind is how the reconciler reads and writes one kind of request.
type kind[T client.Object] struct {
	name string
	// object is a new, empty request; list lists them.
	object func() T
	list   func(ctx context.Context, c client.Client, opts ...client.ListOption) ([]T, error)
	// request and status are what a decision reads of one; apply writes
	// what it decided into its status.
	request func(T) Request
	status  func(T) Status
	apply   func(Status, T)
	vm      func(T) string
	// job reads a restore's Job and claim (nil for a request no Job
	// carries out), and makeJob creates what a decision asks for; both
	// nil for a kind no Job carries out.
	job     func(ctx context.Context, c client.Client, obj T) (*JobState, error)
	makeJob func(ctx context.Context, r *Reconciler, obj T, in Inputs, d Decision) (problem string, err error)
}

var snapshots = kind[*v1alpha1.GuestSnapshot]{
	name:   "guestsnapshot",
	object: func() *v1alpha1.GuestSnapshot { return &v1alpha1.GuestSnapshot{} },
	list: func(ctx context.Context, c client.Client, opts ...client.ListOption) ([]*v1alpha1.GuestSnapshot, error) {
		l := &v1alpha1.GuestSnapshotList{}
		if err := c.List(ctx, l, opts...); err != nil {
			return nil, err
		}
		return pointers(l.Items), nil
	},
	request: SnapshotRequest,
	status:  func(s *v1alpha1.GuestSnapshot) Status { return SnapshotStatus(s.Status) },
	apply:   func(st Status, s *v1alpha1.GuestSnapshot) { applySnapshot(st, &s.Status) },
	vm:      func(s *v1alpha1.GuestSnapshot) string { return s.Spec.VM },
}

var restores = kind[*v1alpha1.GuestRestore]{
	name:   "guestrestore",
	object: func() *v1alpha1.GuestRestore { return &v1alpha1.GuestRestore{} },
	list: func(ctx context.Context, c client.Client, opts ...client.ListOption) ([]*v1alpha1.GuestRestore, error) {
		l := &v1alpha1.GuestRestoreList{}
		if err := c.List(ctx, l, opts...); err != nil {
			return nil, err
		}
		return pointers(l.Items), nil
	},
	request: RestoreRequest,
	status:  func(g *v1alpha1.GuestRestore) Status { return RestoreStatus(g.Status) },
	apply:   func(st Status, g *v1alpha1.GuestRestore) { applyRestore(st, &g.Status) },
	vm:      func(g *v1alpha1.GuestRestore) string { return g.Spec.VM },
	job:     jobOf,
	makeJob: makeJob,
}

// pointers points at each item of a list.
func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// SetupWithManager registers the reconciler for both kinds: the requests,
// their VMs, and the activity ConfigMaps, mapped to the requests their
// guests answered.
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
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorderFor("guestbackup-requests")
	}
	if err := setup(mgr, &kindReconciler[*v1alpha1.GuestSnapshot]{Reconciler: r, kind: snapshots}); err != nil {
		return err
	}
	return setup(mgr, &kindReconciler[*v1alpha1.GuestRestore]{Reconciler: r, kind: restores})
}

// kindReconciler keeps the status of one kind of request.
type kindReconciler[T client.Object] struct {
	*Reconciler
	kind kind[T]
}

// setup indexes one kind of request and registers its controller.
func setup[T client.Object](mgr ctrl.Manager, r *kindReconciler[T]) error {
	k := r.kind
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), k.object(), uidIndex, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return fmt.Errorf("index %s by UID: %w", k.name, err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), k.object(), vmIndex, func(o client.Object) []string {
		return []string{k.vm(o.(T))}
	}); err != nil {
		return fmt.Errorf("index %s by VM: %w", k.name, err)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(k.name).
		For(k.object())
	if k.job != nil {
		// A Job that fails fails its request, and what keeps its pod
		// from running is said in the request's status.
		b = b.Owns(&batchv1.Job{}).
			Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.restoreOfPod), builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return o.GetLabels()[LabelRestore] != ""
			})))
	}
	return b.
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
func (r *kindReconciler[T]) requestsOfVM(ctx context.Context, o client.Object) []reconcile.Request {
	items, err := r.kind.list(ctx, r.Client, client.InNamespace(o.GetNamespace()), client.MatchingFields{vmIndex: o.GetName()})
	if err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, item := range items {
		if !ended(r.kind.status(item).Phase) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(item)})
		}
	}
	return reqs
}

// restoreOfPod maps a restore Job's pod to its request, by the UID its
// label names.
func (r *kindReconciler[T]) restoreOfPod(ctx context.Context, o client.Object) []reconcile.Request {
	items, err := r.kind.list(ctx, r.Client, client.InNamespace(o.GetNamespace()), client.MatchingFields{uidIndex: o.GetLabels()[LabelRestore]})
	if err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, item := range items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(item)})
	}
	return reqs
}

// answered maps an activity ConfigMap to the requests its guests answered.
func (r *kindReconciler[T]) answered(ctx context.Context, o client.Object) []reconcile.Request {
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
			items, err := r.kind.list(ctx, r.Client, client.MatchingFields{uidIndex: res.UID})
			if err != nil {
				continue
			}
			for _, item := range items {
				// Only a request of the VM the result's guest is: a
				// server lists the results of its own users.
				if identity.OfVM(r.kind.vm(item), item.GetNamespace()) == g.User {
					reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(item)})
				}
			}
		}
	}
	return reqs
}

// Reconcile brings one request's status up to date.
func (r *kindReconciler[T]) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := r.kind.object()
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	in := Inputs{Request: r.kind.request(obj), Status: r.kind.status(obj), Now: r.Clock.Now()}
	if ended(in.Status.Phase) {
		return ctrl.Result{}, nil
	}
	vm := &metav1.PartialObjectMetadata{}
	vm.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: in.Request.Namespace, Name: in.Request.VM}, vm); {
	case err == nil:
		in.VM = vm
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, fmt.Errorf("get VirtualMachine %s/%s: %w", in.Request.Namespace, in.Request.VM, err)
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
	if r.kind.job != nil && in.Server != nil && in.Admitted {
		j, err := r.kind.job(ctx, r.Client, obj)
		if err != nil {
			return ctrl.Result{}, err
		}
		in.Job = j
	}
	d := Decide(in)
	if d.CreateJob || d.CreateClaim {
		// Before the status: a request said to be Pending on a Job has
		// one.
		problem, err := r.kind.makeJob(ctx, r.Reconciler, obj, in, d)
		if err != nil {
			return ctrl.Result{}, err
		}
		if problem != "" {
			in.Job.ClaimProblem = problem
			d = Decide(in)
		}
	}
	orig := obj.DeepCopyObject().(T)
	r.kind.apply(d.Status, obj)
	if equality.Semantic.DeepEqual(orig, obj) {
		return ctrl.Result{}, nil
	}
	if err := r.Client.Status().Patch(ctx, obj, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("update status of %s %s: %w", r.kind.name, req.NamespacedName, err)
	}
	// After the status: a failed write records nothing, and the next
	// pass, which decides again from the same inputs, announces it once.
	for _, e := range d.Events {
		r.Recorder.Event(obj, e.Type, e.Reason, e.Message)
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
	if err := r.Client.Get(ctx, types.NamespacedName{Name: in.Request.Namespace}, ns); err != nil {
		return fmt.Errorf("get namespace %s: %w", in.Request.Namespace, err)
	}
	in.Namespace = ns
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

// jobOf reads GuestRestore g's Job and claim, when g restores into a claim
// (userset.IntoClaim); nil otherwise.
func jobOf(ctx context.Context, c client.Client, g *v1alpha1.GuestRestore) (*JobState, error) {
	if !userset.IntoClaim(g) {
		return nil, nil
	}
	claim, create := ClaimOf(g)
	st := &JobState{Name: RestoreJobName(g), Claim: claim}
	job := &batchv1.Job{}
	switch err := c.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: st.Name}, job); {
	case err == nil && !metav1.IsControlledBy(job, g):
		st.Exists, st.ClaimProblem = true, notOurs(st.Name)
		return st, nil
	case err == nil:
		st.Exists, st.Failed = true, jobFailure(job)
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace(g.Namespace), client.MatchingLabels{LabelRestore: string(g.UID)}); err != nil {
			return nil, fmt.Errorf("list the pods of Job %s/%s: %w", g.Namespace, st.Name, err)
		}
		for i := range pods.Items {
			if w := podWaiting(&pods.Items[i]); w != "" && metav1.IsControlledBy(&pods.Items[i], job) {
				st.Waiting = w
			}
		}
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get Job %s/%s: %w", g.Namespace, st.Name, err)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	switch err := c.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: claim}, pvc); {
	case apierrors.IsNotFound(err):
		pvc = nil
	case err != nil:
		return nil, fmt.Errorf("get PersistentVolumeClaim %s/%s: %w", g.Namespace, claim, err)
	}
	if !st.Exists {
		// Once the Job runs, the claim is its; a claim the request
		// created is labelled its own.
		st.ClaimProblem = claimProblem(g, pvc, create)
	}
	st.CreateClaim = create && pvc == nil
	return st, nil
}

// makeJob creates GuestRestore g's claim and Job, as decision d asks. One
// of ours that exists already (a pass that did not see it yet) is no
// error; a Job of its name that is not g's (one the cache, which holds
// guestbackup's alone, does not show) is a problem the request fails with.
func makeJob(ctx context.Context, r *Reconciler, g *v1alpha1.GuestRestore, in Inputs, d Decision) (string, error) {
	if d.CreateClaim {
		pvc := RestoreClaim(g)
		created := r.Client.Create(ctx, pvc)
		if problem, err := refused("PersistentVolumeClaim", pvc.Name, created); problem != "" || err != nil {
			return problem, err
		}
		if apierrors.IsAlreadyExists(created) {
			// Made since the cache was read: the request's own, or a
			// claim it must not write into.
			existing := &corev1.PersistentVolumeClaim{}
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pvc), existing); err != nil {
				// Gone again (NotFound): the next pass creates it.
				return "", fmt.Errorf("get PersistentVolumeClaim %s/%s: %w", pvc.Namespace, pvc.Name, err)
			}
			if problem := claimProblem(g, existing, true); problem != "" {
				return problem, nil
			}
		}
	}
	if !d.CreateJob {
		return "", nil
	}
	job := RestoreJob(g, in.Server, r.Image, kopiaserver.AssignsPodIDs(in.Namespace))
	created := r.Client.Create(ctx, job)
	if problem, err := refused("Job", job.Name, created); problem != "" || err != nil || created == nil {
		return problem, err
	}
	// Its owner references are metadata: readable without the cache.
	existing := &metav1.PartialObjectMetadata{}
	existing.SetGroupVersionKind(batchv1.SchemeGroupVersion.WithKind("Job"))
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(job), existing); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(existing, g) {
		return notOurs(job.Name), nil
	}
	return "", nil
}

// refused sorts the error of creating a request's kind object name: one
// the API server refuses for good (a quota of the namespace exceeded, an
// object its admission refuses) is a problem the request fails with, in
// the API server's words; AlreadyExists is neither (the caller looks);
// any other is an error, tried again.
func refused(kind, name string, err error) (problem string, _ error) {
	switch {
	case err == nil, apierrors.IsAlreadyExists(err):
		return "", nil
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err):
		return fmt.Sprintf("cannot create %s %s: %v", kind, name, err), nil
	}
	return "", fmt.Errorf("create %s %s: %w", kind, name, err)
}

// notOurs is the problem of a Job of a request's Job's name that is not
// the request's.
func notOurs(name string) string {
	return fmt.Sprintf("Job %s exists and is not this request's: delete it, then make the request again", name)
}
