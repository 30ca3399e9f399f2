// Command controller runs guestbackup's controller manager: it reconciles
// BackupStorageLocationServers into managed Kopia repository servers and the
// per-VM credential Secrets into repository users.
package main

import (
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/guestbackup/guestbackup/internal/manager"
)

// The manager itself needs leases for leader election and events for audit.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

func main() {
	var (
		flags         manager.Flags
		leaderElect   bool
		leaderElectNS string
	)
	flags.Bind(flag.CommandLine)
	flag.BoolVar(&leaderElect, "leader-elect", true, "Elect a leader, so that only one replica reconciles at a time.")
	flag.StringVar(&leaderElectNS, "leader-election-namespace", "", "Namespace of the leader election lease; default: the pod's namespace.")
	flag.Parse()

	if err := run(flags, leaderElect, leaderElectNS); err != nil {
		fmt.Fprintln(os.Stderr, "controller:", err)
		os.Exit(1)
	}
}

func run(flags manager.Flags, leaderElect bool, leaderElectNS string) error {
	mgr, err := manager.New(flags, ctrl.Options{
		LeaderElection:          leaderElect,
		LeaderElectionID:        "controller.guestbackup.io",
		LeaderElectionNamespace: leaderElectNS,
	})
	if err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
