package usersync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/kopia/kopia/repo"
	"github.com/prometheus/client_golang/prometheus"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usage"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// quotaGauges are the quota metrics on user sync's /metrics; what each
// user stores is usage's collector, beside them.
var (
	// UserQuotaBytes is each user's quota, for users that have one:
	// against guestbackup_server_user_stored_bytes it is how close each
	// VM is to having its backups refused.
	UserQuotaBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_server_user_quota_bytes",
		Help: "The quota of each user (a VM's identity <vm>@<namespace>) that has one (spec.quota of the BSLS).",
	}, []string{"user"})
	// UsersOverQuota is how many users the last measurement found at or
	// over their quota: the session gate refuses their writes.
	UsersOverQuota = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "guestbackup_server_users_over_quota",
		Help: "Users (VMs) whose stored bytes reached their quota at the last measurement: their guests' writes are refused.",
	})
)

// quotas is what user sync knows of its users' quotas: the quotas the
// users Secrets set, what the last measurement found each user stores,
// and so the users whose writes the gate refuses. RefusesWrites reads it
// for every request of a session, so the decision is a map lookup, made
// when either side changes.
type quotas struct {
	mu sync.RWMutex
	// bounds are the quotas of the users that have one, by user;
	// exported those UserQuotaBytes has a series of.
	bounds   map[string]int64
	exported map[string]int64
	// used is what the last complete measurement found each user stores,
	// and measuredAt when; zero before one completed.
	used       map[string]int64
	measuredAt time.Time
	// measureErr is why the last measurement failed, empty once one
	// completes.
	measureErr string
	// state is what the storage check publishes; over the users it lists.
	state *maintenancestate.QuotaState
	over  map[string]maintenancestate.QuotaUse
}

// overQuota is the users of used whose quota (in bounds) they reached, in
// the order a QuotaState lists them (maintenancestate.CompareQuotaUse). A
// quota of 0 bytes is reached by every user, so that it refuses every
// write.
func overQuota(used, bounds map[string]int64) []maintenancestate.QuotaUse {
	var over []maintenancestate.QuotaUse
	for user, quota := range bounds {
		if n := used[user]; n >= quota {
			over = append(over, maintenancestate.QuotaUse{User: user, UsedBytes: n, QuotaBytes: quota})
		}
	}
	slices.SortFunc(over, maintenancestate.CompareQuotaUse)
	return over
}

// set takes new bounds or a measurement (nil: unchanged; measuredAt is
// when used was measured), or a measurement's failure, and decides again
// whose writes are refused. A failed measurement keeps the last complete
// one in force.
func (q *quotas) set(bounds, used map[string]int64, measuredAt time.Time, measureErr error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if bounds != nil {
		q.bounds = bounds
	}
	if used != nil {
		q.used, q.measuredAt, q.measureErr = used, measuredAt.UTC().Truncate(time.Second), ""
	}
	if measureErr != nil {
		q.measureErr = measureErr.Error()
	}
	if bounds != nil {
		// Series of users that lost their quota go; the others are set
		// in place, so that no scrape sees them missing.
		for user := range q.exported {
			if _, ok := bounds[user]; !ok {
				UserQuotaBytes.DeleteLabelValues(user)
			}
		}
		for user, quota := range bounds {
			UserQuotaBytes.WithLabelValues(user).Set(float64(quota))
		}
		q.exported = bounds
	}
	if len(q.bounds) == 0 || q.measuredAt.IsZero() {
		// Nobody has a quota, or nothing was measured yet: nobody is
		// refused, and nothing is said.
		q.over, q.state = nil, nil
		UsersOverQuota.Set(0)
		if q.measureErr != "" && len(q.bounds) > 0 {
			q.state = &maintenancestate.QuotaState{Error: q.measureErr}
		}
		return
	}
	over := overQuota(q.used, q.bounds)
	q.over = make(map[string]maintenancestate.QuotaUse, len(over))
	for _, u := range over {
		q.over[u.User] = u
	}
	UsersOverQuota.Set(float64(len(over)))
	q.state = &maintenancestate.QuotaState{
		MeasuredAt: q.measuredAt,
		Error:      q.measureErr,
		OverCount:  len(over),
		Over:       over[:min(len(over), maintenancestate.MaxListedOverQuota)],
	}
}

// refuses is why user may not write, nil when it may.
func (q *quotas) refuses(user string) error {
	q.mu.RLock()
	u, over := q.over[user]
	at := time.Time{}
	if q.state != nil {
		at = q.state.MeasuredAt
	}
	q.mu.RUnlock()
	if !over {
		return nil
	}
	vm, namespace, _ := strings.Cut(user, "@")
	return &QuotaError{VM: namespace + "/" + vm, Use: u, MeasuredAt: at}
}

// published is the state the storage check publishes: a copy.
func (q *quotas) published() *maintenancestate.QuotaState {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.state == nil {
		return nil
	}
	s := *q.state
	s.Over = slices.Clone(q.state.Over)
	return &s
}

// hasBounds is whether some user has a quota, so that measuring is worth
// its walk.
func (q *quotas) hasBounds() bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return len(q.bounds) > 0
}

// QuotaError is why the gate refuses a user's writes: its VM stores its
// quota or more.
type QuotaError struct {
	// VM is the VirtualMachine, as <namespace>/<name>.
	VM string
	// Use is what it stores against its quota.
	Use maintenancestate.QuotaUse
	// MeasuredAt is when that was measured.
	MeasuredAt time.Time
}

// Error is what the guest's kopia prints: what the VM stores, its quota,
// and what its owner can do.
func (e *QuotaError) Error() string {
	return fmt.Sprintf("VirtualMachine %s stores %s, reaching its backup quota of %s (measured at %s): "+
		"its backups are refused until it stores less. Delete some of its snapshots (kopia snapshot delete; on an append-only server, retention expires them instead), or ask the cluster admin to raise its quota",
		e.VM, humanize.IBytes(uint64(max(e.Use.UsedBytes, 0))), humanize.IBytes(uint64(max(e.Use.QuotaBytes, 0))), e.MeasuredAt.Format(time.RFC3339))
}

// RefusesWrites says why user's sessions may not write now (the session
// gate asks for each write request): its VM's last measured usage reached
// its quota. Nil when it may.
func (s *Syncer) RefusesWrites(user string) error { return s.quotas.refuses(user) }

// DesiredQuotas merges the quotas of every shard. It fails while a shard
// is missing or malformed; then the quotas in force stay.
func DesiredQuotas(lister corelisters.SecretNamespaceLister, bsls string) (map[string]int64, error) {
	desired := map[string]int64{}
	for shard := range userset.Shards {
		name := userset.SecretName(bsls, shard)
		secret, err := lister.Get(name)
		if err != nil {
			return nil, fmt.Errorf("users Secret %s: %w", name, err)
		}
		q, err := userset.DecodeQuotas(secret.Data[userset.QuotasKey])
		if err != nil {
			return nil, fmt.Errorf("users Secret %s, key %s: %w", name, userset.QuotasKey, err)
		}
		maps.Copy(desired, q)
	}
	return desired, nil
}

// applyQuotas takes the quotas of the users Secrets, after each sync, so
// that a quota raised or lowered takes effect at once on the last
// measurement; the first quota set has one measured at once.
func (s *Syncer) applyQuotas(lister corelisters.SecretNamespaceLister) {
	bounds, err := DesiredQuotas(lister, s.opts.BSLS)
	if err != nil {
		// The sync says so already, as loud as it matters.
		s.opts.Log.V(1).Info("quotas not read; those in force stay", "why", err.Error())
		return
	}
	had := s.quotas.hasBounds()
	s.quotas.set(bounds, nil, time.Time{}, nil)
	if !had && len(bounds) > 0 {
		select {
		case s.usageDue <- struct{}{}:
		default: // a measurement is due already
		}
	}
}

// watchUsage measures what each user stores every QuotaInterval, and at
// once when the first quota is set, until ctx ends. It runs beside the
// queue: a walk of a large repository must not hold up the syncs that
// add users, change passwords and apply the quotas it measures against.
func (s *Syncer) watchUsage(ctx context.Context) {
	timer := time.NewTimer(s.opts.QuotaInterval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.usageDue:
		case <-timer.C:
		}
		if err := s.measureUsage(ctx); err != nil && ctx.Err() == nil {
			s.opts.Log.Error(err, "usage not measured; the last measurement stays in force", "retryIn", s.opts.QuotaInterval)
		}
		timer.Reset(s.opts.QuotaInterval)
	}
}

// measureUsage measures what each user stores (usage.Measure), when some
// user has a quota, and decides whose writes the gate refuses.
func (s *Syncer) measureUsage(ctx context.Context) error {
	if !s.quotas.hasBounds() {
		return nil
	}
	dr, ok := s.opts.Repository.(repo.DirectRepository)
	if !ok {
		return errors.New("the repository is not opened directly, so what each user stores cannot be measured")
	}
	err := dr.Refresh(ctx)
	var used map[string]int64
	if err == nil {
		used, err = usage.Measure(ctx, dr)
	}
	if err != nil {
		err = fmt.Errorf("measure what each user stores: %w", err)
		s.quotas.set(nil, nil, time.Time{}, err)
		return err
	}
	s.usage.Set(used)
	s.quotas.set(nil, used, time.Now(), nil)
	return nil
}
