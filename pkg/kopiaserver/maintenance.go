package kopiaserver

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/optimistic"
)

// published is what a BSLS's server pods last published in its state
// ConfigMap.
type published struct {
	// Maintenance is the repository's maintenance; nil before its first
	// run.
	Maintenance *v1alpha1.MaintenanceStatus
	// Client is the kopia client the pod serves guests, with the URL they
	// reach it at; nil before it published one, or when that is unreadable.
	Client *v1alpha1.ClientStatus
	// Storage is what each pod last found of the storage, by pod name.
	Storage map[string]maintenancestate.StorageState
	// Integrity is the last verification of the repository; nil before
	// one was published, or when it cannot be read.
	Integrity *maintenancestate.IntegrityState
	// IntegrityUnreadable is why the published verification cannot be
	// read; empty when it can.
	IntegrityUnreadable string
}

// serverState creates the ConfigMap the server pod publishes the
// repository's maintenance in (the pod may only get and update it) and
// returns what the pod last published there; nothing before its first run.
// What the pod wrote is reported as is: the status shows the failure, the
// pod records the MaintenanceFailing Event. A maintenance or verification
// report that cannot be read is said in the status and the condition
// rather than failing the whole reconcile.
//
// The pod publishes the kopia client it serves guests in the same ConfigMap
// (clientdist.Key), returned with the URL guests reach it at: nil
// before it did, or when what it wrote is unreadable (logged; a guest's
// bootstrap then carries no client, and guests keep their own kopia).
func (r *Reconciler) serverState(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (published, error) {
	name := maintenancestate.ConfigMapName(b.Name)
	cm := &corev1.ConfigMap{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: name}, cm); {
	case err == nil:
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.Namespace, Labels: Labels(b)}}
		if err := r.own(b, cm); err != nil {
			return published{}, err
		}
		if err := r.Client.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return published{}, fmt.Errorf("create ConfigMap %s: %w", name, err)
		}
		return published{}, nil
	default:
		return published{}, fmt.Errorf("get ConfigMap %s: %w", name, err)
	}
	var p published
	c, err := clientdist.Decode(cm.Data[clientdist.Key])
	if err != nil {
		log.FromContext(ctx).Error(err, "the server pod's client is unreadable; guests get no client", "configMap", name)
		c = nil
	}
	if c != nil {
		if c.URL, err = clientdist.URL(Endpoint(b)); err != nil {
			c = nil
		}
	}
	p.Client = c
	p.Storage = maintenancestate.StorageStates(cm.Data)
	if err := r.forgetGonePods(ctx, cm, p.Storage); err != nil {
		return published{}, err
	}
	if p.Maintenance, err = maintenancestate.Decode(cm.Data[maintenancestate.Key]); err != nil {
		p.Maintenance = &v1alpha1.MaintenanceStatus{Failure: err.Error()}
	}
	if p.Integrity, err = maintenancestate.DecodeIntegrity(cm.Data[maintenancestate.IntegrityKey]); err != nil {
		p.Integrity, p.IntegrityUnreadable = nil, err.Error()
	}
	return p, nil
}

// forgetGonePods removes from the state ConfigMap cm the storage states
// no pod has published for maintenancestate.StorageForgotten (its pod is
// gone: every rollout names new pods), and from states with them, so that
// the ConfigMap does not grow with every pod that ever ran. A write that
// lost a race with a pod's is left for the next pass.
func (r *Reconciler) forgetGonePods(ctx context.Context, cm *corev1.ConfigMap, states map[string]maintenancestate.StorageState) error {
	now := r.Clock.Now()
	var gone []string
	for pod, st := range states {
		if now.Sub(st.CheckedAt) > maintenancestate.StorageForgotten {
			gone = append(gone, pod)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	err := optimistic.Patch(ctx, r.Client, cm, func() {
		for _, pod := range gone {
			delete(cm.Data, maintenancestate.StorageKey(pod))
			delete(states, pod)
		}
	})
	if err := optimistic.IgnoreConflict(err); err != nil {
		return fmt.Errorf("forget the storage state of gone server pods %v in ConfigMap %s: %w", gone, cm.Name, err)
	}
	return nil
}

// DefaultMaintenanceClusterRole is the ClusterRole the chart installs, as
// release "guestbackup", for the server pods of a BSLS with several
// replicas: get and update of Leases, the rules the markers of
// pkg/serverpod/maintenance ask for (config/rbac/server-maintenance).
// The controller binds it (MaintenanceRoleBinding) and holds `bind` on it
// alone: RBAC lets the controller grant a right through a Role only if it
// holds the right itself, and the controller never reads or writes a Lease
// after creating it.
const DefaultMaintenanceClusterRole = "guestbackup-server-maintenance"

// MaintenanceRoleBinding grants b's server pods, in b's namespace, the
// ClusterRole clusterRole (DefaultMaintenanceClusterRole, under the
// chart's name): the Lease maintenancestate.LeaseName they elect their
// maintenance runner with. A ClusterRole names no Lease, so the pods may
// get and update any Lease of b's namespace; only a BSLS with several
// replicas gets it (SharesMaintenance).
func MaintenanceRoleBinding(b *v1alpha1.BackupStorageLocationServer, clusterRole string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: ServiceAccountName(b) + "-maintenance", Namespace: b.Namespace, Labels: Labels(b)},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccountName(b), Namespace: b.Namespace}},
	}
}

// maintenanceElection lets b's server pods elect their maintenance runner
// when b runs several (SharesMaintenance): it creates the Lease they elect
// it with (the pods hold it; the controller never writes it again; it goes
// with the BSLS), and binds them the ClusterRole that lets them hold it.
// A BSLS that runs one pod no longer has that binding.
func (r *Reconciler) maintenanceElection(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) error {
	binding := MaintenanceRoleBinding(b, r.MaintenanceClusterRole)
	if binding.RoleRef.Name == "" {
		binding.RoleRef.Name = DefaultMaintenanceClusterRole
	}
	if !SharesMaintenance(b) {
		err := r.Client.Get(ctx, client.ObjectKeyFromObject(binding), &rbacv1.RoleBinding{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("get RoleBinding %s: %w", binding.Name, err)
		}
		if err := r.Client.Delete(ctx, binding); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete RoleBinding %s: %w", binding.Name, err)
		}
		return nil
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: maintenancestate.LeaseName(b.Name), Namespace: b.Namespace, Labels: Labels(b)}}
	if err := r.own(b, lease); err != nil {
		return err
	}
	if err := r.Client.Create(ctx, lease); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Lease %s: %w", lease.Name, err)
	}
	return r.apply(ctx, b, binding)
}

// bslsOfMaintenanceConfigMap maps a BSLS's maintenance ConfigMap, which
// its server pod updates after every run, to the BSLS.
func bslsOfMaintenanceConfigMap(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[LabelBSLS]
	if name == "" || o.GetName() != maintenancestate.ConfigMapName(name) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}
