// Package manager builds the controller-runtime manager both guestbackup
// binaries run, from the flags they share.
package manager

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
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

// NewManager is ctrl.NewManager whose recorders (GetEventRecorderFor)
// record through eventrecord.NewBroadcaster, whose spam filter keeps a
// budget per reason: with controller-runtime's, one flapping Warning
// silences every other Warning of its object. controller-runtime's own
// recorders (leader election's) are left as they are.
func NewManager(cfg *rest.Config, opts ctrl.Options) (ctrl.Manager, error) {
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	events, err := typedcorev1.NewForConfigAndClient(cfg, mgr.GetHTTPClient())
	if err != nil {
		return nil, fmt.Errorf("create the Events client: %w", err)
	}
	return &withEvents{Manager: mgr, sink: &typedcorev1.EventSinkImpl{Interface: events.Events("")}}, nil
}

// withEvents is a manager whose recorders share one broadcaster of
// eventrecord's, started by the first recorder asked for, with one sink.
// (controller-runtime's Options.EventBroadcaster would give one
// broadcaster to two recorder providers, each starting a sink on it: with
// leader election, every Event was written twice.)
type withEvents struct {
	ctrl.Manager
	sink record.EventSink

	once        sync.Once
	broadcaster record.EventBroadcaster
}

// GetEventRecorderFor returns a recorder of Events from name.
func (m *withEvents) GetEventRecorderFor(name string) record.EventRecorder {
	m.once.Do(func() {
		m.broadcaster = eventrecord.NewBroadcaster()
		m.broadcaster.StartRecordingToSink(m.sink)
		log := m.GetLogger().WithName("events")
		m.broadcaster.StartEventWatcher(func(e *corev1.Event) {
			log.V(1).Info(e.Message, "type", e.Type, "object", e.InvolvedObject, "reason", e.Reason)
		})
	})
	return m.broadcaster.NewRecorder(m.GetScheme(), corev1.EventSource{Component: name})
}

// Start runs the manager until ctx ends and it has stopped, then shuts
// the broadcaster down, once nothing records any more.
func (m *withEvents) Start(ctx context.Context) error {
	err := m.Manager.Start(ctx)
	m.once.Do(func() {}) // from now on no recorder starts one
	if m.broadcaster != nil {
		m.broadcaster.Shutdown()
	}
	return err
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
