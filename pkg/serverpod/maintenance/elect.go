package maintenance

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// A pod elects through the Lease the controller created: client-go's
// LeaseLock gets and updates it (releasing it is an update too). These
// rules are the ClusterRole the chart installs for the server pods of a
// BSLS with several replicas (config/rbac/server-maintenance), which the
// controller binds to them (kopiaserver.MaintenanceRoleBinding).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;update

// Election makes one of a BSLS's server pods its maintenance runner: the
// one holding a coordination.k8s.io Lease. Kopia's own maintenance lock
// stays the safety net; the Lease keeps the other pods from even trying.
type Election struct {
	// Leases are the BSLS's namespace's; Lease names the one the
	// controller created (maintenancestate.LeaseName).
	Leases coordinationv1.LeasesGetter
	// Namespace and Lease name the Lease.
	Namespace, Lease string
	// Identity is this pod's name.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's
	// leader election timings; default 30s, 20s and 5s. A pod that
	// vanishes hands maintenance over within LeaseDuration.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       logr.Logger
}

// Run calls lead whenever this pod holds the Lease, with a context that
// ends when it stops holding it, until ctx ends. lead returns when its
// context ends, or early on failure: the Lease is then released so that
// another pod may take over, and this pod stands again after RetryPeriod.
func (e Election) Run(ctx context.Context, lead func(ctx context.Context) error) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Lease},
		Client:     e.Leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	retry := orDefault(e.RetryPeriod, 5*time.Second)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		round, cancel := context.WithCancel(ctx)
		defer cancel()
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   orDefault(e.LeaseDuration, 30*time.Second),
			RenewDeadline:   orDefault(e.RenewDeadline, 20*time.Second),
			RetryPeriod:     retry,
			ReleaseOnCancel: true,
			Name:            e.Lease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					e.Log.Info("holding the maintenance Lease: this pod runs maintenance", "lease", e.Lease)
					if err := lead(ctx); err != nil {
						e.Log.Error(err, "maintenance stopped; releasing the Lease")
					}
					cancel()
				},
				OnStoppedLeading: func() { e.Log.Info("not holding the maintenance Lease", "lease", e.Lease) },
			},
		})
		if err != nil {
			e.Log.Error(err, "maintenance election not started")
			return
		}
		le.Run(round)
	}, retry)
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// StartElected runs maintenance (Start) while this pod holds e's Lease,
// until ctx ends or stop is called.
func StartElected(ctx context.Context, e Election, c Config) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(ctx, func(ctx context.Context) error {
			stopRun, err := Start(ctx, c)
			if err != nil {
				return fmt.Errorf("start maintenance: %w", err)
			}
			<-ctx.Done()
			stopRun()
			return nil
		})
	}()
	return func() {
		cancel()
		<-done
	}
}
