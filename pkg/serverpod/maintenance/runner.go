package maintenance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	kopiamaintenance "github.com/kopia/kopia/repo/maintenance"
	"github.com/kopia/kopia/snapshot/snapshotmaintenance"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// ReasonMaintenanceFailing is the reason of the Warning Event on the BSLS
// when a maintenance run failed, or cannot run because someone else owns
// the repository's maintenance: the data of expired snapshots stays in the
// storage until a run succeeds.
const ReasonMaintenanceFailing = "MaintenanceFailing"

// ReasonMaintenanceRecovered is the reason of the Normal Event on the BSLS
// when maintenance succeeded again after failing.
const ReasonMaintenanceRecovered = "MaintenanceRecovered"

// Metrics of the user-sync container's /metrics, labelled by cycle
// ("quick" or "full"). See docs/events.md.
var (
	LastRun = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_server_maintenance_last_run_timestamp_seconds",
		Help: "When guestbackup's last maintenance run of the cycle ended (Unix time), whatever its outcome.",
	}, []string{"cycle"})
	LastSuccess = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_server_maintenance_last_success_timestamp_seconds",
		Help: "When guestbackup's last successful maintenance run of the cycle ended (Unix time).",
	}, []string{"cycle"})
	Failures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "guestbackup_server_maintenance_failures_total",
		Help: "Maintenance runs that failed, or could not run because the repository's maintenance belongs to someone else.",
	}, []string{"cycle"})
	Failing = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "guestbackup_server_maintenance_failing",
		Help: "1 while the last maintenance attempt failed or could not run (see the MaintenanceFailing Event), 0 after a success.",
	})
	NextRun = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "guestbackup_server_maintenance_next_run_timestamp_seconds",
		Help: "When Kopia's schedule next has a maintenance cycle due (Unix time); 0 while guestbackup does not own maintenance.",
	})
)

func init() {
	// Failures are exported at 0 for every cycle before the first one, so
	// that an alert on their increase has a series to compare with.
	for _, cycle := range []string{"quick", "full", "unknown"} {
		Failures.WithLabelValues(cycle)
	}
}

// Collectors are the metrics above, for a registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{LastRun, LastSuccess, Failures, Failing, NextRun}
}

// Reporter receives what the Runner wants the admin to know; the user-sync
// container records Events on the BSLS.
type Reporter interface {
	Report(warning bool, reason, message string)
}

// Publisher receives the maintenance state after every run, for the
// controller (ConfigMapPublisher).
type Publisher interface {
	Publish(ctx context.Context, s v1alpha1.MaintenanceStatus) error
}

// Options configure a Runner.
type Options struct {
	// Repository is opened from the owner's configuration (Connect).
	Repository repo.DirectRepository
	// Safety is Kopia's safety margins; the zero value is
	// kopiamaintenance.SafetyFull. Tests set SafetyNone, so that data is
	// deleted at once rather than hours after its snapshots expired.
	Safety *kopiamaintenance.SafetyParameters
	// MinWait and MaxWait bound the wait between two checks of Kopia's
	// schedule. Default: a minute and an hour.
	MinWait, MaxWait time.Duration
	// Exclusive, when set, is held for a whole run: verification holds
	// it too (integrity.Options.Exclusive).
	Exclusive sync.Locker
	// Clock is the Runner's; default the real one.
	Clock   clock.Clock
	Reports Reporter
	// Publish, when set, receives the state after every run.
	Publish Publisher
	Log     logr.Logger
}

// Runner runs maintenance when Kopia's schedule has a cycle due.
type Runner struct {
	opts Options
	// failing is the last failure's message, so that a failure repeating
	// the same way is one Event. Only Run's goroutine touches it.
	failing string
	// state is what was last published, unpublished whether the last
	// publication failed (Run then tries again after MinWait). Only Run's
	// goroutine touches them.
	state       v1alpha1.MaintenanceStatus
	unpublished bool
}

// NewRunner returns a Runner; Run starts it.
func NewRunner(o Options) *Runner {
	if o.Safety == nil {
		o.Safety = &kopiamaintenance.SafetyFull
	}
	if o.MinWait <= 0 {
		o.MinWait = time.Minute
	}
	if o.MaxWait <= 0 {
		o.MaxWait = time.Hour
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Runner{opts: o}
}

// Result is what one run did.
type Result struct {
	// Cycle is the cycle that ran: "quick", "full" or "" when none was due.
	Cycle string
	// Next is when the schedule has the next cycle due; zero when
	// maintenance is not ours.
	Next time.Time
}

// errNotOwned says maintenance belongs to someone else.
var errNotOwned = errors.New("repository maintenance is owned by someone else")

// RunOnce runs the cycle Kopia's schedule has due (mode
// kopiamaintenance.ModeAuto), or the one mode names, and reports it.
func (r *Runner) RunOnce(ctx context.Context, mode kopiamaintenance.Mode) (Result, error) {
	if r.opts.Exclusive != nil {
		r.opts.Exclusive.Lock()
		defer r.opts.Exclusive.Unlock()
	}
	res, err := r.run(ctx, mode)
	r.report(res, err)
	r.publish(ctx, res, err)
	return res, err
}

// publish hands the state to the Publisher; a failure to publish is
// logged, and the next run publishes again.
func (r *Runner) publish(ctx context.Context, res Result, err error) {
	if r.opts.Publish == nil {
		return
	}
	now := metav1.NewTime(r.opts.Clock.Now())
	s := r.state
	if params, perr := kopiamaintenance.GetParams(ctx, r.opts.Repository); perr == nil {
		s.Owner = params.Owner
	}
	if res.Cycle != "" {
		s.LastRun, s.LastCycle = &now, res.Cycle
		if err == nil {
			s.LastSuccess = &now
		}
	}
	s.NextRun = nil
	if !res.Next.IsZero() {
		s.NextRun = &metav1.Time{Time: res.Next}
	}
	s.Failure = ""
	if err != nil {
		s.Failure = err.Error()
	}
	if perr := r.opts.Publish.Publish(ctx, s); perr != nil {
		r.opts.Log.Error(perr, "maintenance state not published for the controller", "retryIn", r.opts.MinWait)
		r.unpublished = true
		return
	}
	r.state, r.unpublished = s, false
}

func (r *Runner) run(ctx context.Context, mode kopiamaintenance.Mode) (Result, error) {
	dr := r.opts.Repository
	if err := dr.Refresh(ctx); err != nil {
		return Result{}, fmt.Errorf("refresh repository: %w", err)
	}
	before, err := kopiamaintenance.GetSchedule(ctx, dr)
	if err != nil {
		return Result{}, fmt.Errorf("read maintenance schedule: %w", err)
	}
	err = repo.DirectWriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "guestbackup maintenance"},
		func(ctx context.Context, w repo.DirectRepositoryWriter) error {
			return snapshotmaintenance.Run(ctx, w, mode, false, *r.opts.Safety)
		})
	var notOwned kopiamaintenance.NotOwnedError
	if errors.As(err, &notOwned) {
		return Result{}, fmt.Errorf("%w (%s), so guestbackup does not run it and storage grows until they do: %w", errNotOwned, notOwned.Owner, err)
	}
	after, serr := kopiamaintenance.GetSchedule(ctx, dr)
	if serr != nil {
		return Result{}, errors.Join(err, fmt.Errorf("read maintenance schedule: %w", serr))
	}
	res := Result{Cycle: cycleRan(before, after)}
	if res.Next, serr = kopiamaintenance.TimeToAttemptNextMaintenance(ctx, dr); serr != nil {
		return res, errors.Join(err, serr)
	}
	if err != nil {
		return res, fmt.Errorf("%s maintenance: %w", orUnknown(res.Cycle), err)
	}
	// Kopia records a failed task in the schedule and returns its error,
	// so a nil error is a run whose every task succeeded.
	return res, nil
}

// cycleRan says which cycle moved the schedule: a run reschedules its
// cycle before it starts (full also reschedules quick).
func cycleRan(before, after *kopiamaintenance.Schedule) string {
	switch {
	case !after.NextFullMaintenanceTime.Equal(before.NextFullMaintenanceTime):
		return "full"
	case !after.NextQuickMaintenanceTime.Equal(before.NextQuickMaintenanceTime):
		return "quick"
	default:
		return ""
	}
}

func orUnknown(cycle string) string {
	if cycle == "" {
		return "scheduled"
	}
	return cycle
}

// report sets the metrics and tells the admin about a new failure, or
// about the end of one.
func (r *Runner) report(res Result, err error) {
	now := float64(r.opts.Clock.Now().Unix())
	if !res.Next.IsZero() {
		NextRun.Set(float64(res.Next.Unix()))
	} else {
		NextRun.Set(0)
	}
	if res.Cycle != "" {
		LastRun.WithLabelValues(res.Cycle).Set(now)
	}
	if err == nil {
		Failing.Set(0)
		if res.Cycle != "" {
			LastSuccess.WithLabelValues(res.Cycle).Set(now)
			r.opts.Log.Info("maintenance ran", "cycle", res.Cycle, "next", res.Next)
		}
		if r.failing != "" {
			r.failing = ""
			r.tell(false, ReasonMaintenanceRecovered, fmt.Sprintf("Repository maintenance succeeded again (%s cycle); next run %s", orUnknown(res.Cycle), res.Next.UTC().Format(time.RFC3339)))
		}
		return
	}
	cycle := res.Cycle
	if cycle == "" {
		cycle = "unknown"
	}
	Failures.WithLabelValues(cycle).Inc()
	Failing.Set(1)
	r.opts.Log.Error(err, "maintenance failed", "cycle", cycle)
	if err.Error() == r.failing {
		return
	}
	r.failing = err.Error()
	r.tell(true, ReasonMaintenanceFailing, fmt.Sprintf("Repository maintenance failed, so the data of expired snapshots stays in the storage: %v", err))
}

func (r *Runner) tell(warning bool, reason, message string) {
	if r.opts.Reports != nil {
		r.opts.Reports.Report(warning, reason, message)
	}
}

// Run runs maintenance whenever Kopia's schedule has a cycle due, until
// ctx ends. It reads the schedule from the repository each time, so
// another pod's run (Kopia's owner check and lock keep runs apart)
// postpones this one's.
func (r *Runner) Run(ctx context.Context) {
	for {
		res, _ := r.RunOnce(ctx, kopiamaintenance.ModeAuto)
		wait := r.opts.MaxWait
		if !res.Next.IsZero() {
			wait = min(max(res.Next.Sub(r.opts.Clock.Now()), r.opts.MinWait), r.opts.MaxWait)
		}
		if r.unpublished {
			wait = r.opts.MinWait
		}
		select {
		case <-ctx.Done():
			return
		case <-r.opts.Clock.After(wait):
		}
	}
}
