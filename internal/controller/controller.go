// Package controller is cmd/controller's wiring: the cache the controller
// runs with and the reconcilers it registers. internal/local and the chart's
// test run the controller through it, so that what they prove is the
// configuration the binary ships.
package controller

import (
	"fmt"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/backupclient"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/requeststatus"
)

// Options are the controller's settings (cmd/controller's flags).
type Options struct {
	// Image holds kopia and guestbackup-server; server pods run it.
	Image string
	// Namespace is the controller's own; every server's NetworkPolicy
	// admits it.
	Namespace string
	// CertManagerCA has cert-manager issue each BSLS's CA
	// (kopiaserver.Reconciler.CertManagerCA).
	CertManagerCA bool
	// Hashers is how many passwords are hashed in parallel.
	Hashers int
	// ActivityInterval is how often server pods publish their guests' new
	// snapshots for the audit; 0 disables it.
	ActivityInterval time.Duration
	// MaintenanceClusterRole is the ClusterRole the chart installs for the
	// server pods of BSLSs with several replicas, which the controller
	// binds; default kopiaserver.DefaultMaintenanceClusterRole.
	MaintenanceClusterRole string
	// GuestNotConnectedAfter is how long after its start a running VM's
	// guest may take to connect before GuestNotConnected; 0: the audit's
	// default.
	GuestNotConnectedAfter time.Duration
	// Requests carries out GuestSnapshots (alpha): the chart sets it, and
	// installs their API, with requests.enabled.
	Requests bool
	// CARotationMinOverlap is how long a CA rotation gives guests the next
	// CA at least (kopiaserver.Reconciler.CARotationMinOverlap); 0: its
	// default.
	CARotationMinOverlap time.Duration
	// CARotationClientOverlap is how long a CA rotation gives BackupClients'
	// workloads (kopiaserver.Reconciler.CARotationClientOverlap); 0: its
	// default.
	CARotationClientOverlap time.Duration
}

// Scheme is the controller's scheme: the binaries' (manager.NewScheme) and
// cert-manager's, whose Certificates the BSLS reconciler owns. Without it
// the controller cannot start on a cluster that serves cert-manager's API.
func Scheme() *runtime.Scheme {
	s := manager.NewScheme()
	utilruntime.Must(certmanagerv1.AddToScheme(s))
	return s
}

// Setup registers the controller's reconcilers with mgr, which must run
// with Cache, and its readiness check.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.Image == "" {
		return fmt.Errorf("the server image is required")
	}
	if o.Namespace == "" {
		return fmt.Errorf("the controller's namespace is required")
	}
	r := &kopiaserver.Reconciler{Image: o.Image, ControllerNamespace: o.Namespace, ActivityInterval: o.ActivityInterval, CertManagerCA: o.CertManagerCA,
		MaintenanceClusterRole: o.MaintenanceClusterRole, Requests: o.Requests, CARotationMinOverlap: o.CARotationMinOverlap,
		CARotationClientOverlap: o.CARotationClientOverlap}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the BackupStorageLocationServer controller: %w", err)
	}
	if err := (&credentials.Hasher{Client: mgr.GetClient()}).SetupWithManager(mgr, max(o.Hashers, 1)); err != nil {
		return fmt.Errorf("set up the credential hasher: %w", err)
	}
	if err := (&credentials.VMReconciler{}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the VM credential reconciler: %w", err)
	}
	if err := (&credentials.BootstrapReconciler{}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the VM bootstrap reconciler: %w", err)
	}
	if err := (&backupclient.Reconciler{}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the BackupClient reconciler: %w", err)
	}
	if err := (&audit.Reconciler{NotConnectedAfter: o.GuestNotConnectedAfter}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the guest activity audit: %w", err)
	}
	if o.Requests {
		if err := (&requeststatus.Reconciler{Image: o.Image}).SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up the GuestSnapshot controller: %w", err)
		}
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	return nil
}
