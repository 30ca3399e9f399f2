package testbed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/guestbackup/guestbackup/internal/manager"
)

// ManagerOptions adjust RunManager.
type ManagerOptions struct {
	Logger logr.Logger
	// MetricsAddr serves /metrics there (a loopback address); none when empty.
	MetricsAddr string
	// WebhookServer is the manager's webhook server; default: one that
	// is started only when a webhook is registered.
	WebhookServer webhook.Server
	// Cache adjusts the manager's cache (its Scheme is always the API
	// server's).
	Cache cache.Options
	// LeaderElectionID, when set, runs the manager with leader election on
	// a Lease of that name in LeaderElectionNamespace, as the chart's
	// replicas run; RunManager returns once it is elected.
	LeaderElectionID, LeaderElectionNamespace string
}

// electionTimeout bounds a manager's election when no other holds the
// Lease.
const electionTimeout = 2 * time.Minute

// RunManager starts a controller-runtime manager from manager.NewManager
// against api, listening on no port unless asked, after setup has registered its controllers; stop
// ends it and waits, at most 30 s. Several managers may run one after
// another in one process (controller names are not checked for uniqueness).
func RunManager(api *APIServer, o ManagerOptions, setup func(ctrl.Manager) error) (stop func() error, err error) {
	metricsAddr := o.MetricsAddr
	if metricsAddr == "" {
		metricsAddr = "0"
	}
	mgr, err := manager.NewManager(api.Config, ctrl.Options{
		Scheme:                  api.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  "0",
		Logger:                  o.Logger,
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
		WebhookServer:           o.WebhookServer,
		Cache:                   o.Cache,
		LeaderElection:          o.LeaderElectionID != "",
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectionNamespace,
	})
	if err != nil {
		return nil, err
	}
	if err := setup(mgr); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stop = func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("the manager did not stop within 30s")
		}
	}
	if o.LeaderElectionID != "" {
		select {
		case <-mgr.Elected():
		case <-time.After(electionTimeout):
			return nil, errors.Join(fmt.Errorf("the manager was not elected within %v", electionTimeout), stop())
		}
	}
	return stop, nil
}

// Percentile returns the p-th percentile (nearest rank) of durations; it
// sorts them.
func Percentile(durations []time.Duration, p int) time.Duration {
	slices.Sort(durations)
	i := (len(durations)*p+99)/100 - 1
	return durations[max(i, 0)]
}
