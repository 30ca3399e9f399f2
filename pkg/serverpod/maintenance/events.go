package maintenance

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	corev1 "k8s.io/api/core/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverpod/integrity"
)

// ReasonMaintenanceOwnerClaimed is the reason of the Normal Event on the
// BSLS when init made guestbackup's identity the repository's maintenance
// owner (it had none, or another guestbackup identity).
const ReasonMaintenanceOwnerClaimed = "MaintenanceOwnerClaimed"

// Event is one Event to record on the BSLS.
type Event struct {
	Warning         bool
	Reason, Message string
}

// EventReporter records what it is told as Events on one object (the
// BSLS).
type EventReporter struct {
	Recorder record.EventRecorder
	Object   *corev1.ObjectReference
}

// Report records one Event.
func (e EventReporter) Report(warning bool, reason, message string) {
	kind := corev1.EventTypeNormal
	if warning {
		kind = corev1.EventTypeWarning
	}
	e.Recorder.Event(e.Object, kind, reason, message)
}

// Config is what Start runs.
type Config struct {
	// ConfigFile is the owner's configuration init wrote; Password the
	// repository's.
	ConfigFile, Password string
	Reports              Reporter
	// Publish receives the maintenance state and the repository's
	// integrity (ConfigMapPublisher).
	Publish interface {
		Publisher
		integrity.Publisher
	}
	// Verify configures the repository's verification (package
	// integrity), which runs beside maintenance, as the same owner, never
	// at the same time as a maintenance run; a zero Interval runs none.
	Verify VerifyConfig
	Log    logr.Logger
}

// VerifyConfig configures verification.
type VerifyConfig struct {
	// Interval is the time between two passes; ReadBytesPerPass the pack
	// bytes a pass reads back (integrity.Options).
	Interval         time.Duration
	ReadBytesPerPass int64
	// Server is the pod's Kopia server, refreshed after a pass changed
	// the index or the notices.
	Server integrity.Refresher
}

// Start opens the owner's configuration init wrote and runs a Runner on
// it, and a verifier when c.Verify asks for one, until ctx ends; stop
// waits for them and closes the repository.
func Start(ctx context.Context, c Config) (stop func(), err error) {
	r, err := repo.Open(ctx, c.ConfigFile, c.Password, &repo.Options{})
	if err != nil {
		return nil, fmt.Errorf("open repository as the maintenance owner (%s): %w", c.ConfigFile, err)
	}
	closers := []func(){func() { _ = r.Close(context.Background()) }}
	closeAll := func() {
		for _, f := range closers {
			f()
		}
	}
	dr, ok := r.(repo.DirectRepository)
	if !ok {
		closeAll()
		return nil, fmt.Errorf("%s is not a direct repository connection", c.ConfigFile)
	}
	var exclusive sync.Mutex
	runner := NewRunner(Options{Repository: dr, Exclusive: &exclusive, Reports: c.Reports, Publish: c.Publish, Log: c.Log})
	var verifier *integrity.Verifier
	if c.Verify.Interval > 0 {
		uncached, err := integrity.OpenUncached(ctx, c.ConfigFile, c.Password)
		if err != nil {
			closeAll()
			return nil, err
		}
		closers = append(closers, func() { _ = uncached.Close(context.Background()) })
		verifier = integrity.NewVerifier(integrity.Options{
			Repository: dr, Reader: uncached, Interval: c.Verify.Interval, ReadBytesPerPass: c.Verify.ReadBytesPerPass,
			Exclusive: &exclusive, Server: c.Verify.Server, Reports: c.Reports, Publish: c.Publish, Log: c.Log.WithName("verify"),
		})
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { runner.Run(ctx) })
	if verifier != nil {
		wg.Go(func() { verifier.Run(ctx) })
	}
	return func() {
		cancel()
		wg.Wait()
		closeAll()
	}, nil
}

// ConfigMapPublisher writes the state into the BSLS's maintenance
// ConfigMap (maintenancestate), which the controller created; the pod's
// Role allows get and update of that name only.
type ConfigMapPublisher struct {
	ConfigMaps typedcorev1.ConfigMapInterface
	BSLS       string
}

// PublishIntegrity writes the repository's integrity under
// maintenancestate.IntegrityKey.
func (p ConfigMapPublisher) PublishIntegrity(ctx context.Context, s maintenancestate.IntegrityState) error {
	return maintenancestate.SetKey(ctx, p.ConfigMaps, p.BSLS, maintenancestate.IntegrityKey, func(string) string {
		return maintenancestate.EncodeIntegrity(s)
	})
}

// Publish updates the ConfigMap when the state changed.
func (p ConfigMapPublisher) Publish(ctx context.Context, s v1alpha1.MaintenanceStatus) error {
	return maintenancestate.SetKey(ctx, p.ConfigMaps, p.BSLS, maintenancestate.Key, func(current string) string {
		merged := s
		// A restarted pod knows nothing of the runs before it: keep what
		// the ConfigMap says of them until it runs again.
		if old, err := maintenancestate.Decode(current); err == nil && old != nil {
			if merged.LastRun == nil {
				merged.LastRun, merged.LastCycle = old.LastRun, old.LastCycle
			}
			if merged.LastSuccess == nil {
				merged.LastSuccess = old.LastSuccess
			}
		}
		return maintenancestate.Encode(merged)
	})
}
