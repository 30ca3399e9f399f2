// Command controller runs guestbackup's controller manager: it reconciles
// BackupStorageLocationServers into managed Kopia repository servers and the
// per-VM credential Secrets into repository users.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// The manager records Events (controller-runtime's recorder writes core/v1
// Events). Its leader election Lease lives in the release namespace: the
// chart's Role there grants it, and no rule here, so that no Lease outside
// that namespace is the controller's to take.
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

type options struct {
	flags         manager.Flags
	leaderElect   bool
	leaderElectNS string
	namespace     string
	image         string
	certManagerCA bool
	hashers       int
	activity      time.Duration
}

func main() {
	var o options
	o.flags.Bind(flag.CommandLine)
	flag.BoolVar(&o.leaderElect, "leader-elect", true, "Elect a leader, so that only one replica reconciles at a time.")
	flag.StringVar(&o.leaderElectNS, "leader-election-namespace", "", "Namespace of the leader election Lease; default: --namespace, where the chart's Role grants Leases.")
	flag.StringVar(&o.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "The controller's namespace; every server's NetworkPolicy admits it.")
	flag.StringVar(&o.image, "server-image", "", "Image of the Kopia server pods (holds kopia and guestbackup-server).")
	flag.BoolVar(&o.certManagerCA, "cert-manager-ca", false, "Have cert-manager issue the CA of each BSLS that names no issuer or Secret (a selfSigned Issuer, CA Certificate and CA Issuer in its namespace); false, or without cert-manager: the controller issues it. Either way every BSLS has a CA of its own.")
	flag.IntVar(&o.hashers, "hash-concurrency", runtime.NumCPU(), "Passwords hashed in parallel (each hash takes about 64 MiB and a core for a fraction of a second).")
	flag.DurationVar(&o.activity, "guest-activity-interval", time.Minute, "How often server pods publish their guests' new snapshots for the audit (Events and metrics on VMs); 0 disables it.")
	flag.Parse()

	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "controller:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.image == "" {
		return fmt.Errorf("--server-image is required")
	}
	if o.namespace == "" {
		return fmt.Errorf("--namespace (or POD_NAMESPACE) is required")
	}
	if o.leaderElectNS == "" {
		o.leaderElectNS = o.namespace
	}
	mgr, err := manager.New(o.flags, ctrl.Options{
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "controller.guestbackup.io",
		LeaderElectionNamespace: o.leaderElectNS,
		// Only guestbackup's Pods, ConfigMaps and Secrets are cached.
		Cache: manager.ControllerCache(),
	})
	if err != nil {
		return err
	}
	r := &kopiaserver.Reconciler{Image: o.image, ControllerNamespace: o.namespace, ActivityInterval: o.activity, CertManagerCA: o.certManagerCA}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the BackupStorageLocationServer controller: %w", err)
	}
	if err := (&credentials.Hasher{Client: mgr.GetClient()}).SetupWithManager(mgr, o.hashers); err != nil {
		return fmt.Errorf("set up the credential hasher: %w", err)
	}
	vms := &credentials.VMReconciler{}
	if err := vms.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the VM credential reconciler: %w", err)
	}
	if err := (&audit.Reconciler{}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the guest activity audit: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
