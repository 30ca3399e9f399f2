package maintenance

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	corev1 "k8s.io/api/core/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
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

// Start opens the owner's configuration init wrote and runs a Runner on
// it until ctx ends; stop waits for it and closes the repository.
func Start(ctx context.Context, configFile, password string, reports Reporter, publish Publisher, log logr.Logger) (stop func(), err error) {
	r, err := repo.Open(ctx, configFile, password, &repo.Options{})
	if err != nil {
		return nil, fmt.Errorf("open repository as the maintenance owner (%s): %w", configFile, err)
	}
	dr, ok := r.(repo.DirectRepository)
	if !ok {
		_ = r.Close(ctx)
		return nil, fmt.Errorf("%s is not a direct repository connection", configFile)
	}
	runner := NewRunner(Options{Repository: dr, Reports: reports, Publish: publish, Log: log})
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { runner.Run(ctx) })
	return func() {
		cancel()
		wg.Wait()
		_ = r.Close(context.Background())
	}, nil
}

// ConfigMapPublisher writes the state into the BSLS's maintenance
// ConfigMap (maintenancestate), which the controller created; the pod's
// Role allows get and update of that name only.
type ConfigMapPublisher struct {
	ConfigMaps typedcorev1.ConfigMapInterface
	BSLS       string
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
