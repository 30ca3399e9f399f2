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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// The manager itself needs leases for leader election and events for audit.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

type options struct {
	flags         manager.Flags
	leaderElect   bool
	leaderElectNS string
	namespace     string
	image         string
	issuerName    string
	issuerKind    string
	hashers       int
	activity      time.Duration
}

func main() {
	var o options
	o.flags.Bind(flag.CommandLine)
	flag.BoolVar(&o.leaderElect, "leader-elect", true, "Elect a leader, so that only one replica reconciles at a time.")
	flag.StringVar(&o.leaderElectNS, "leader-election-namespace", "", "Namespace of the leader election lease; default: the pod's namespace.")
	flag.StringVar(&o.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "The controller's namespace; every server's NetworkPolicy admits it.")
	flag.StringVar(&o.image, "server-image", "", "Image of the Kopia server pods (holds kopia and guestbackup-server).")
	flag.StringVar(&o.issuerName, "default-issuer", "", "cert-manager issuer for servers whose BSLS names none; empty: the controller issues a CA per server.")
	flag.StringVar(&o.issuerKind, "default-issuer-kind", "ClusterIssuer", "Kind of --default-issuer: Issuer or ClusterIssuer.")
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
	mgr, err := manager.New(o.flags, ctrl.Options{
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "controller.guestbackup.io",
		LeaderElectionNamespace: o.leaderElectNS,
		// Only guestbackup's pods and ConfigMaps matter; others are not cached.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue})},
			// The activity and CA bundle ConfigMaps are guestbackup's own.
			&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue})},
		}},
	})
	if err != nil {
		return err
	}
	r := &kopiaserver.Reconciler{Image: o.image, ControllerNamespace: o.namespace, ActivityInterval: o.activity}
	if o.issuerName != "" {
		r.DefaultIssuer = &v1alpha1.IssuerReference{Name: o.issuerName, Kind: o.issuerKind, Group: "cert-manager.io"}
	}
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
