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

	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// The manager records Events (controller-runtime's recorder writes core/v1
// Events). Its leader election Lease lives in the release namespace: the
// chart's Role there grants it, and no rule here, so that no Lease outside
// that namespace is the controller's to take.
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

func main() {
	var (
		flags         manager.Flags
		o             controller.Options
		leaderElect   bool
		leaderElectNS string
	)
	flags.Bind(flag.CommandLine)
	flag.BoolVar(&leaderElect, "leader-elect", true, "Elect a leader, so that only one replica reconciles at a time.")
	flag.StringVar(&leaderElectNS, "leader-election-namespace", "", "Namespace of the leader election Lease; default: --namespace, where the chart's Role grants Leases.")
	flag.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "The controller's namespace; every server's NetworkPolicy admits it.")
	flag.StringVar(&o.Image, "server-image", "", "Image of the Kopia server pods (holds kopia and guestbackup-server).")
	flag.BoolVar(&o.CertManagerCA, "cert-manager-ca", false, "Have cert-manager issue the CA of each BSLS that names no issuer or Secret (a selfSigned Issuer, CA Certificate and CA Issuer in its namespace); false, or without cert-manager: the controller issues it. Either way every BSLS has a CA of its own.")
	flag.IntVar(&o.Hashers, "hash-concurrency", runtime.NumCPU(), "Passwords hashed in parallel (each hash takes about 64 MiB and a core for a fraction of a second).")
	flag.DurationVar(&o.ActivityInterval, "guest-activity-interval", time.Minute, "How often server pods publish their guests' new snapshots for the audit (Events and metrics on VMs); 0 disables it.")
	flag.StringVar(&o.MaintenanceClusterRole, "server-maintenance-cluster-role", kopiaserver.DefaultMaintenanceClusterRole, "The ClusterRole (get and update of Leases) bound to the server pods of a BSLS with several replicas, so that they elect the one that runs maintenance; the chart installs it and grants the controller the bind verb on it alone.")
	flag.DurationVar(&o.GuestNotConnectedAfter, "guest-not-connected-after", audit.DefaultNotConnectedAfter, "How long after its start a running VM's guest (one with guestbackup.io/paths) may go without connecting before the GuestNotConnected Event and metric.")
	flag.DurationVar(&o.CARotationMinOverlap, "ca-rotation-min-overlap", kopiaserver.DefaultCARotationMinOverlap, "How long a rotation of a BSLS's CA gives guests the next CA at least before its server switches, once no running guest waits for it (so that VMs admitted meanwhile are seen).")
	flag.DurationVar(&o.CARotationClientOverlap, "ca-rotation-client-overlap", kopiaserver.DefaultCARotationClientOverlap, "How long a rotation of a BSLS's CA gives the workloads of its BackupClients, whose Secret carries both CAs, to restart before its server switches: nothing tells when they read their Secret.")
	flag.BoolVar(&o.Requests, "requests", false, "Carry out requests from the cluster (GuestSnapshot; alpha): their API must be installed (the chart's requests.enabled).")
	flag.Parse()

	controller.SetGCPercent()
	if err := run(flags, o, leaderElect, leaderElectNS); err != nil {
		fmt.Fprintln(os.Stderr, "controller:", err)
		os.Exit(1)
	}
}

func run(flags manager.Flags, o controller.Options, leaderElect bool, leaderElectNS string) error {
	if o.Image == "" {
		return fmt.Errorf("--server-image is required")
	}
	if o.Namespace == "" {
		return fmt.Errorf("--namespace (or POD_NAMESPACE) is required")
	}
	if leaderElectNS == "" {
		leaderElectNS = o.Namespace
	}
	mgr, err := manager.New(flags, ctrl.Options{
		LeaderElection:          leaderElect,
		LeaderElectionID:        "controller.guestbackup.io",
		LeaderElectionNamespace: leaderElectNS,
		Cache:                   controller.Cache(),
		Scheme:                  controller.Scheme(),
	})
	if err != nil {
		return err
	}
	if err := controller.Setup(mgr, o); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
