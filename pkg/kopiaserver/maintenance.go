package kopiaserver

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// serverState creates the ConfigMap the server pod publishes the
// repository's maintenance in (the pod may only get and update it) and
// returns what the pod last published there; nil before its first run.
// What the pod wrote is reported as is: the status shows the failure, the
// pod records the MaintenanceFailing Event.
//
// The pod publishes the kopia client it serves guests in the same ConfigMap
// (clientdist.Key), returned second with the URL guests reach it at: nil
// before it did, or when what it wrote is unreadable (logged; a guest's
// bootstrap then carries no client, and guests keep their own kopia).
func (r *Reconciler) serverState(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*v1alpha1.MaintenanceStatus, *v1alpha1.ClientStatus, error) {
	name := maintenancestate.ConfigMapName(b.Name)
	cm := &corev1.ConfigMap{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: name}, cm); {
	case err == nil:
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.Namespace, Labels: Labels(b)}}
		if err := r.own(b, cm); err != nil {
			return nil, nil, err
		}
		if err := r.Client.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, nil, fmt.Errorf("create ConfigMap %s: %w", name, err)
		}
		return nil, nil, nil
	default:
		return nil, nil, fmt.Errorf("get ConfigMap %s: %w", name, err)
	}
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
	s, err := maintenancestate.Decode(cm.Data[maintenancestate.Key])
	if err != nil {
		// The pod's word is unreadable: say so in the status rather than
		// failing the whole reconcile.
		return &v1alpha1.MaintenanceStatus{Failure: err.Error()}, c, nil
	}
	return s, c, nil
}

// maintenanceLease creates the Lease b's server pods elect their
// maintenance runner with, when b runs several (SharesMaintenance). The
// pods hold it; the controller never writes it again. It goes with the BSLS.
func (r *Reconciler) maintenanceLease(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) error {
	if !SharesMaintenance(b) {
		return nil
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: maintenancestate.LeaseName(b.Name), Namespace: b.Namespace, Labels: Labels(b)}}
	if err := r.own(b, lease); err != nil {
		return err
	}
	if err := r.Client.Create(ctx, lease); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Lease %s: %w", lease.Name, err)
	}
	return nil
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
