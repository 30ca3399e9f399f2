// Package manager builds the controller-runtime manager both guestbackup
// binaries run, from the flags they share.
package manager

import (
	"context"
	"flag"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	guestbackupv1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/eventrecord"
)

// NewScheme returns a scheme with the types guestbackup reads and writes:
// Kubernetes' own, guestbackup's and KubeVirt's.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(guestbackupv1alpha1.AddToScheme(s))
	utilruntime.Must(kubevirtv1.AddToScheme(s))
	return s
}

// Flags are the settings every guestbackup binary takes.
type Flags struct {
	MetricsAddr string
	ProbeAddr   string
	// PprofAddr serves Go's profiles (net/http/pprof), off by default:
	// what an admin measuring the binary's memory or CPU turns on, on a
	// port nothing else reaches.
	PprofAddr string
	Log       zap.Options
}

// Bind registers the flags on fs.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.MetricsAddr, "metrics-bind-address", ":8080", "Address the Prometheus metrics endpoint binds to; 0 disables it.")
	fs.StringVar(&f.ProbeAddr, "health-probe-bind-address", ":8081", "Address the liveness and readiness probes bind to.")
	fs.StringVar(&f.PprofAddr, "pprof-bind-address", "", "Address Go's profiles (/debug/pprof/) bind to; empty disables them.")
	f.Log.BindFlags(fs)
}

// New sets up logging and returns a manager with guestbackup's scheme
// (NewScheme, unless opts names one), the metrics endpoint, and a liveness
// check; opts adds what one binary needs.
// Callers add their readiness checks.
func New(f Flags, opts ctrl.Options) (ctrl.Manager, error) {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&f.Log)))
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	if opts.Scheme == nil {
		opts.Scheme = NewScheme()
	}
	opts = withCacheSyncTimeout(opts)
	opts.Metrics = metricsserver.Options{BindAddress: f.MetricsAddr}
	opts.HealthProbeBindAddress = f.ProbeAddr
	opts.PprofBindAddress = f.PprofAddr
	mgr, err := NewManager(cfg, opts)
	if err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add liveness check: %w", err)
	}
	return mgr, nil
}

// NewManager is ctrl.NewManager recording Events through
// eventrecord.NewBroadcaster, whose spam filter keeps a budget per reason:
// with controller-runtime's, one flapping Warning silences every other
// Warning of its object. The broadcaster is shut down when the manager's
// Start returns.
func NewManager(cfg *rest.Config, opts ctrl.Options) (ctrl.Manager, error) {
	events := eventrecord.NewBroadcaster()
	// Deprecated because a broadcaster the manager does not own outlives
	// it: withEvents.Start shuts it down.
	opts.EventBroadcaster = events //nolint:staticcheck
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		events.Shutdown()
		return nil, fmt.Errorf("create manager: %w", err)
	}
	return &withEvents{Manager: mgr, events: events}, nil
}

// withEvents is a manager that owns an Event broadcaster it was given.
type withEvents struct {
	ctrl.Manager
	events record.EventBroadcaster
}

// Start runs the manager until ctx ends, then shuts the broadcaster down:
// only once Start has returned, because the manager records Events while
// it stops, until its recorder provider itself has stopped.
func (m *withEvents) Start(ctx context.Context) error {
	defer m.events.Shutdown()
	return m.Manager.Start(ctx)
}

// CacheSyncTimeout is how long a controller waits for its caches' first
// lists before the binary gives up and exits. controller-runtime's default
// is 2 minutes; with 10,000 opted-in VMs the controller's lists took 38 s
// on 2 cores and over 2 minutes on 2 cores shared with a busy neighbour
// (BenchmarkOptedInVMs), after which it exited and, restarted, would list
// everything again from the start.
const CacheSyncTimeout = 10 * time.Minute

// withCacheSyncTimeout is opts with CacheSyncTimeout unless they set one.
func withCacheSyncTimeout(opts ctrl.Options) ctrl.Options {
	if opts.Controller.CacheSyncTimeout == 0 {
		opts.Controller.CacheSyncTimeout = CacheSyncTimeout
	}
	return opts
}
