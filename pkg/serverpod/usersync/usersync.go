// Package usersync is the user-sync container of a Kopia server pod. It
// watches its BSLS's users Secrets, applies the users they list to the
// repository by diff (add, change, delete; never re-hashing a password), and
// makes the running server see the change at once through its control API.
//
// It also keeps the repository's access rules exactly guestbackup's
// (kopiauser.ACLsFor), removing and reporting any other ACL manifest, and,
// on an append-only server, keeps guests' retention harmless and applies
// the admin's on the server's clock (package retention).
//
// It reads only its own Secrets: each users Secret is watched by name
// (a field selector on metadata.name), which the server's Role allows by
// resourceNames, so the pod needs no right on any other Secret.
//
// It syncs only a complete view: until every shard Secret exists it changes
// nothing, and a shard it cannot parse stops the sync rather than revoking
// the users it would have listed. A repository on storage that a new
// cluster attaches (disaster recovery) keeps its users until the
// controller has written the full desired set.
package usersync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/snapshot/policy"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverpod/activityscan"
	"github.com/guestbackup/guestbackup/pkg/serverpod/logins"
	"github.com/guestbackup/guestbackup/pkg/serverpod/repostats"
	"github.com/guestbackup/guestbackup/pkg/serverpod/retention"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usage"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// ReasonForeignACLRemoved is the reason of the Warning Event on the BSLS
// when user sync removed an ACL manifest guestbackup did not write: a
// guest or someone holding the repository password tried to change who
// may do what.
const ReasonForeignACLRemoved = "ForeignACLRemoved"

// ForeignACLsRemoved counts the ACL manifests user sync removed because
// guestbackup did not write them (guestbackup_server_foreign_acls_removed_total,
// on the user-sync container's /metrics).
var ForeignACLsRemoved = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "guestbackup_server_foreign_acls_removed_total",
	Help: "ACL manifests found in the repository that guestbackup did not write, removed by user sync.",
})

// ReasonRetentionFailed is the reason of the Warning Event on the BSLS when
// an append-only server's retention could not run: its snapshots are not
// expired until it runs again.
const ReasonRetentionFailed = "RetentionFailed"

// RetentionFailures counts the runs of server-time retention that failed
// (guestbackup_server_retention_failures_total).
var RetentionFailures = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "guestbackup_server_retention_failures_total",
	Help: "Runs of guestbackup's server-time retention (append-only servers) that failed; snapshots wait for the next run.",
})

// SnapshotsExpired counts the snapshots the server-time retention of an
// append-only server deleted (guestbackup_server_snapshots_expired_total).
var SnapshotsExpired = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "guestbackup_server_snapshots_expired_total",
	Help: "Snapshots deleted by guestbackup's retention on the server's clock (append-only servers).",
})

// SnapshotsCreated counts the snapshots the activity scan found written
// while this pod ran (guestbackup_server_snapshots_created_total): the
// snapshots already in the repository at its first scan are not counted,
// so a restart is no burst.
var SnapshotsCreated = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "guestbackup_server_snapshots_created_total",
	Help: "Snapshots guests wrote while this server pod ran, as its activity scan found them.",
})

// GateCredentialsLoaded is 1 while the Kopia server has loaded the
// gate's newest credentials, so that the gate hands it those for the
// passwords it verified and logins cost Kopia no hash, and 0 while the
// guests' own passwords go on to it
// (guestbackup_server_gate_credentials_loaded).
var GateCredentialsLoaded = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "guestbackup_server_gate_credentials_loaded",
	Help: "1 while the Kopia server has loaded the session gate's credentials (logins cost it no hash), 0 while guests' own passwords go on to it.",
})

// Server is the running Kopia server user sync keeps current
// (serverpod.ControlClient).
type Server interface {
	// Refresh makes it re-read the repository.
	Refresh(ctx context.Context) error
	// Connected reports whether it answers with its repository open.
	Connected(ctx context.Context) (bool, error)
	// Accepts reports whether it authenticates user with password.
	Accepts(ctx context.Context, user, password string) (bool, error)
}

// Options configure a Syncer.
type Options struct {
	// Client reads the users Secrets.
	Client kubernetes.Interface
	// Namespace and BSLS name the server whose users are synced.
	Namespace string
	BSLS      string
	// Repository is the open repository the server serves.
	Repository repo.Repository
	// Server is refreshed after every change of the access it enforces,
	// whoever wrote it (this pod or another replica); its readiness is the
	// pod's.
	Server Server
	// Sessions, when set, are the sessions guests hold open with Server
	// (package sessiongate): after each change, the sessions of the users
	// whose access it narrowed are ended, so that they reconnect under the
	// access in force. Kopia authorizes a session once, when it opens.
	Sessions Sessions
	// BSLSUID is the BSLS's UID, so that its Events name it exactly.
	BSLSUID types.UID
	// Events receives the Warning Events about foreign ACLs and failed
	// retention runs; nil: none.
	Events record.EventRecorder
	// AppendOnly keeps the repository's ACLs at kopiauser.AppendOnlyACLs,
	// so guests cannot delete snapshots, makes the retention guests can
	// trigger keep everything, and applies Retention on the server's clock;
	// otherwise the ACLs are kopiauser.DefaultACLs and guests' clients
	// apply retention as Kopia's do.
	AppendOnly bool
	// Retention is the admin's retention (retention.FromSpec of the BSLS's
	// defaultPolicy), applied every RetentionInterval on an append-only
	// server.
	Retention policy.RetentionPolicy
	// RetentionInterval is how often Retention is applied; 0: hourly.
	RetentionInterval time.Duration
	// RemovedBefore are foreign ACLs the init container removed before the
	// server started; Run reports them with its first sync.
	RemovedBefore []kopiauser.ForeignACL
	// ActivityInterval is how often the repository's new snapshots are
	// read and published in the activity ConfigMaps, and the snapshots of
	// each source counted for /metrics; 0: never.
	ActivityInterval time.Duration
	// StatsInterval is how often the repository's size is measured for
	// /metrics (repostats.Measure lists every blob of the storage); 0:
	// never.
	StatsInterval time.Duration
	// QuotaInterval is how often what each user stores is measured
	// (package usage) while some user has a quota in the users Secrets,
	// so that the gate refuses the writes of those that reached it
	// (RefusesWrites); 0: never, and nobody is refused.
	QuotaInterval time.Duration
	// Resync is how often the repository is compared with the Secrets even
	// when no Secret changed, to undo changes made by other writers.
	// Default: 5 minutes.
	Resync time.Duration
	// RetryAfter is the first delay after a failed sync; it doubles up to
	// Resync. Default: 1 second.
	RetryAfter time.Duration
	// HtpasswdFile is the Kopia server's --htpasswd-file; empty: none.
	// With it, the gate verifies every guest's password itself (Admits),
	// on any free core and from memory for a returning guest, and hands
	// the server a credential of this process (logins.Credentials) that
	// it checks without a hash: user sync writes there the credentials of
	// the users the server enforces, before the refresh that applies them.
	HtpasswdFile string
	// Pod is this server pod's name; StorageCheckInterval is how often it
	// checks the repository's storage and publishes what it finds
	// (checkStorage). 0, or no Pod: never.
	Pod                  string
	StorageCheckInterval time.Duration
	// Clock stamps the guests' results to their requests; nil: the real
	// clock.
	Clock clock.PassiveClock
	Log   logr.Logger

	// space, when set, is shared with the pod's other writers (Serve's
	// maintenance), whose refused writes it holds too; New makes one
	// otherwise.
	space *spaceState
}

// work is an item of a Syncer's queue: one kind of work on the repository.
// One queue and one worker serialize them, so a sync, a scan of guest
// activity and a retention run never touch the repository at once.
type work string

const (
	// syncUsers compares the repository with the users Secrets: queued by
	// every change of a Secret, every Resync, and after a failure with the
	// queue's exponential backoff.
	syncUsers work = "sync-users"
	// publishActivity publishes the guests' new snapshots, every
	// ActivityInterval.
	publishActivity work = "publish-activity"
	// applyRetention applies the admin's retention on an append-only
	// server, every RetentionInterval.
	applyRetention work = "apply-retention"
	// measureRepository measures the repository's size for /metrics,
	// every StatsInterval.
	measureRepository work = "measure-repository"
)

// Syncer keeps a repository's users equal to the users Secrets.
type Syncer struct {
	opts Options
	// queue holds the work due; a key added while it waits or runs is
	// done once more, after, as a Secret changed since must be seen.
	queue workqueue.TypedRateLimitingInterface[work]
	// backoff is the queue's rate limiter: RetryAfter after a failed
	// sync, doubling up to Resync.
	backoff workqueue.TypedRateLimiter[work]

	// activity belongs to Run's goroutine; scanned is whether it scanned
	// once, so that SnapshotsCreated counts only what came after.
	activity *activityscan.Scanner
	scanned  bool
	// stats serves the repository's last measurement and snapshot counts
	// on /metrics.
	stats *repostats.Collector
	// quotas are the users' quotas and what they store (RefusesWrites);
	// usage serves what they store on /metrics; usageDue wakes the
	// measurements when the first quota is set (watchUsage).
	quotas   quotas
	usage    *usage.Collector
	usageDue chan struct{}

	mu sync.Mutex
	// status is why the pod may not serve guests (Ready); notApplied the
	// words of the write the repository refused (NotApplied).
	status     error
	notApplied string
	users      int
	// lister reads the users Secrets once Run watches them; reports are
	// the guests' reports not published yet (package clientserver).
	lister  corelisters.SecretNamespaceLister
	reports map[string]activity.Report
	// ended are the requests whose ending this pod recorded or found
	// recorded (Result), by UID; verifying lets one ending at a time read
	// the repository.
	ended     map[string]bool
	verifying sync.Mutex
	// polls wakes the polls held for a shard's guests when its users
	// Secret's requests change; decoded keeps what they list.
	polls   shardSignals
	decoded requestsCache
	// seenListed are the requests the users Secrets listed at some
	// publish, by "user uid", for as long as the process lives (a request
	// is a line of a Secret; they are few).
	seenListed map[string]bool
	// asked is the digest of the requests the users Secrets listed at the
	// last publish of activity (askedRequests); only Run's goroutine
	// touches it.
	asked string
	// enforced are the password hashes of the users the Kopia server
	// enforces since the last sync that applied them (inForce.Users),
	// never changed in place: Admits leaves a password to the server
	// only where the users Secrets hold the same hash.
	enforced map[string]identity.Hash
	// handed are the users whose credential the Kopia server has loaded
	// from HtpasswdFile since the last sync that applied them, never
	// changed in place; nil without the file.
	handed map[string]bool

	// verifier verifies the passwords of the gate's sessions and of the
	// client port's reports; credentials are what the gate hands the
	// server for a password the verifier accepted.
	verifier    *logins.Verifier
	credentials *logins.Credentials
	// decoyVersion is the hash version most listed users have, as the
	// last sync read them: what an unknown user's login costs, as a known
	// one's would. Taken from the Secrets, never from logins, which a
	// tenant could steer with its own user to time someone else's name.
	decoyVersion atomic.Int32
	// written are the users whose credentials HtpasswdFile holds, as this
	// process last wrote it; nil: not written yet. generation numbers
	// that file (logins.Credentials.Check), loaded the generation the
	// server was last seen to have loaded. Only Run's goroutine touches
	// them.
	written            map[string]bool
	generation, loaded uint64

	// refreshPending is set when users were written but the server has not
	// confirmed a refresh since (it may not be listening yet): the next
	// sync refreshes even when it finds nothing to change. Only Run's
	// goroutine touches it.
	refreshPending bool
	// unreported are foreign ACLs removed but not reported yet: they are
	// reported once the server has refreshed. Only Run's goroutine
	// touches it.
	unreported []kopiauser.ForeignACL
	// inForce is the access the server enforces since the last sync that
	// applied the users; nil before the first. changed and removed are the
	// users and the access rules the syncs since wrote into and removed
	// from the repository: with inForce, they say whose sessions to end
	// once the server enforces the change. Only Run's goroutine touches
	// them.
	inForce *Access
	changed []kopiauser.Change
	removed []kopiauser.ACL
	// rulesInPlace is whether the last sync found or wrote the
	// repository's access rules exactly guestbackup's; viewErr why the
	// view of the Secrets it read was incomplete (nil when complete, or
	// when it failed before reading it). Only Run's goroutine touches
	// them.
	rulesInPlace bool
	viewErr      error
	// listed are the users the users Secrets listed when their removals
	// and rotations last had their sessions ended, by a sync that applied
	// them or one that could not (endUnwritten). Only Run's goroutine
	// touches it.
	listed map[string]identity.Hash
	// storage is the storage state last published; nil before the first
	// check. Only the storage check's goroutine touches it.
	storage *maintenancestate.StorageState
	// space is the storage's space and the writes it refused, which the
	// storage check publishes and /metrics exports.
	space *spaceState
	// retentionErr is the last retention run's failure, so that a run that
	// keeps failing the same way is one Event, not one per interval. Only
	// Run's goroutine touches it.
	retentionErr string
}

var errNotSynced = errors.New("users not synced yet")

// New returns a Syncer; Run starts it.
func New(opts Options) *Syncer {
	if opts.Resync <= 0 {
		opts.Resync = 5 * time.Minute
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = time.Second
	}
	if opts.RetentionInterval <= 0 {
		opts.RetentionInterval = time.Hour
	}
	if opts.space == nil {
		opts.space = &spaceState{}
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	backoff := workqueue.NewTypedItemExponentialFailureRateLimiter[work](opts.RetryAfter, opts.Resync)
	return &Syncer{
		opts:     opts,
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(backoff, workqueue.TypedRateLimitingQueueConfig[work]{}),
		backoff:  backoff,
		status:   errNotSynced,
		activity: activityscan.New(),
		stats:    &repostats.Collector{},
		usage:    &usage.Collector{},
		usageDue: make(chan struct{}, 1),
		space:    opts.space,
		verifier: logins.New(logins.Options{}),
		// Derived anew by each process: the file's credentials of an
		// earlier one mean nothing to this one's gate.
		credentials: logins.NewCredentials(),
	}
}

// Ready returns nil while the pod may serve guests, else why not (serving).
// A sync that cannot write the users (a full or failing storage) leaves
// it ready: the gate enforces the users Secrets by itself (Admits,
// endUnwritten), and guests must still list and restore what they have;
// NotApplied says what was not written.
func (s *Syncer) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// NotApplied is the storage's words when it refused to take the users or
// the access rules user sync wrote, "" once a write was taken. The first
// refusal's words stay until then, so that a sync retried against the
// same full storage says nothing new.
func (s *Syncer) NotApplied() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notApplied
}

// noteApplied records whether a sync's write into the repository was
// taken (err nil) or refused (NotApplied).
func (s *Syncer) noteApplied(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil:
		s.notApplied = ""
	case s.notApplied == "":
		s.notApplied = err.Error()
	}
}

// Users is the number of users in the last successful sync.
func (s *Syncer) Users() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users
}

func (s *Syncer) setStatus(status, err error, users int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = status
	if err == nil {
		s.users = users
	}
}

// serving is why the pod may not serve guests after a sync that ended
// with err (Ready), nil when it may: while the view of the users Secrets
// is complete, the gate enforces it whatever the repository holds, so a
// failed write of the users keeps the pod serving. Until a sync has
// applied the users, the access rules must be guestbackup's, as the Kopia
// server, not the gate, enforces them.
func (s *Syncer) serving(lister corelisters.SecretNamespaceLister, err error) error {
	if err == nil {
		return nil
	}
	// The sync's own view, when it read one: the Secrets may be complete
	// by now, but the users this sync applied are not theirs.
	if s.viewErr != nil {
		return s.viewErr
	}
	if _, _, viewErr := DesiredUsers(lister, s.opts.BSLS); viewErr != nil {
		return viewErr
	}
	if s.inForce == nil && !s.rulesInPlace {
		return err
	}
	return nil
}

// poke queues a sync: a users Secret changed. A sync already queued sees
// this change too; one running is followed by another.
func (s *Syncer) poke() { s.queue.Add(syncUsers) }

// Run watches the users Secrets and syncs until ctx ends. It works the
// queue in its own goroutine, its one worker.
func (s *Syncer) Run(ctx context.Context) error {
	defer s.queue.ShutDown()
	s.unreported = s.opts.RemovedBefore
	lister, stop, err := s.watchShards(ctx)
	defer stop()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.lister = lister
	s.mu.Unlock()
	s.queue.Add(syncUsers)
	if s.opts.ActivityInterval > 0 {
		s.queue.AddAfter(publishActivity, s.opts.ActivityInterval)
	}
	if s.opts.AppendOnly {
		s.queue.AddAfter(applyRetention, s.opts.RetentionInterval)
	}
	if s.opts.StatsInterval > 0 {
		// After the first sync, so that a new pod has figures to scrape.
		s.queue.Add(measureRepository)
	}
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	if s.opts.QuotaInterval > 0 {
		go s.watchUsage(ctx)
	}
	if s.opts.StorageCheckInterval > 0 && s.opts.Pod != "" {
		// Beside the queue: a sync stuck on a storage that hangs must not
		// delay telling the admin so.
		go s.watchStorage(ctx, s.opts.StorageCheckInterval)
	}
	for {
		item, shutdown := s.queue.Get()
		if shutdown {
			return nil
		}
		if ctx.Err() == nil {
			s.do(ctx, lister, item)
		}
		s.queue.Done(item)
	}
}

// do does one item of work and queues its next run.
func (s *Syncer) do(ctx context.Context, lister corelisters.SecretNamespaceLister, item work) {
	switch item {
	case publishActivity:
		if err := s.publishActivity(ctx); err != nil {
			s.opts.Log.Error(err, "guest activity or catalogues not published", "retryIn", s.opts.ActivityInterval)
		}
		// Also queued by a guest's report: the interval's own schedule
		// stays one (the queue keeps one waiting item per kind).
		if s.opts.ActivityInterval > 0 {
			s.queue.AddAfter(publishActivity, s.opts.ActivityInterval)
		}
	case applyRetention:
		s.reportRetention(s.applyRetention(ctx))
		s.queue.AddAfter(applyRetention, s.opts.RetentionInterval)
	case measureRepository:
		if err := s.measureRepository(ctx); err != nil {
			s.opts.Log.Error(err, "repository not measured", "retryIn", s.opts.StatsInterval)
		}
		s.queue.AddAfter(measureRepository, s.opts.StatsInterval)
	case syncUsers:
		users, err := s.syncOnce(ctx, lister)
		s.setStatus(s.serving(lister, err), err, users)
		s.noteWrite(err)
		// The quotas are the Secrets' alone: taken whether or not the
		// repository took the users.
		s.applyQuotas(lister)
		if s.dryRunsListed(lister) {
			// A new dry run is listed now, not at the next interval.
			s.queue.Add(publishActivity)
		}
		if err != nil {
			// When is AddRateLimited's delay, taken here to log it.
			delay := s.backoff.When(syncUsers)
			s.opts.Log.Error(err, "user sync failed", "retryIn", delay)
			s.queue.AddAfter(syncUsers, delay)
			return
		}
		s.queue.Forget(syncUsers)
		s.queue.AddAfter(syncUsers, s.opts.Resync)
	}
}

// syncOnce reads the complete desired set, applies it and returns how many
// users the repository now has. When it cannot (a full storage refuses
// the write, the server does not refresh), the sessions of the users the
// Secrets took away end all the same (endUnwritten): revocation never
// waits for the storage.
func (s *Syncer) syncOnce(ctx context.Context, lister corelisters.SecretNamespaceLister) (int, error) {
	users, err := s.apply(ctx, lister)
	if err != nil {
		s.endUnwritten(lister)
	}
	return users, err
}

// apply is syncOnce's work.
func (s *Syncer) apply(ctx context.Context, lister corelisters.SecretNamespaceLister) (int, error) {
	r := s.opts.Repository
	s.viewErr = nil // not read yet
	// Another writer (an admin's `kopia server user add`, a guest's forged
	// ACL) may have changed the repository.
	if err := r.Refresh(ctx); err != nil {
		return 0, fmt.Errorf("refresh repository: %w", err)
	}
	// The desired users, and the restore grants among them: read first,
	// applied after the access rules.
	desired, grants, usersErr := DesiredUsers(lister, s.opts.BSLS)
	s.viewErr = usersErr
	// Access rules before users: a user never exists under rules other
	// than guestbackup's. A grant is kept only while the view is complete
	// and its grantee a desired user; otherwise it is revoked, which is
	// safe (the grantee loses read access until the next sync).
	rules := kopiauser.ACLsFor(s.opts.AppendOnly)
	for _, g := range grants {
		if _, ok := desired[g.Grantee]; ok && usersErr == nil {
			rules = append(rules, kopiauser.GrantACL(g.Grantee, g.Source))
		}
	}
	acls, err := kopiauser.SyncACLs(ctx, r, rules)
	s.rulesInPlace = err == nil
	if err != nil {
		s.noteApplied(err)
		return 0, err
	}
	s.removed = append(s.removed, acls.Removed...)
	if acls.Changed {
		s.refreshPending = true
		s.opts.Log.Info("access rules written", "appendOnly", s.opts.AppendOnly, "restoreGrants", len(rules)-len(kopiauser.ACLsFor(s.opts.AppendOnly)))
	}
	s.unreported = append(s.unreported, acls.Foreign...)
	// A failure here must not keep users from being revoked or rotated:
	// it is reported after them.
	var policiesErr error
	if s.opts.AppendOnly {
		fixed, unreadable, err := retention.GuestPolicies(ctx, r)
		if err != nil {
			policiesErr = err
			s.opts.Log.Error(err, "retention guests can trigger not made harmless; users are synced regardless")
		}
		if len(fixed) > 0 {
			s.refreshPending = true
			s.opts.Log.Info("retention guests can trigger set to keep everything; guestbackup applies the admin's on the server's clock", "policies", fmt.Sprint(fixed))
		}
		if len(unreadable) > 0 {
			s.opts.Log.Info("policy manifests that do not parse were skipped; Kopia cannot apply them either", "manifests", fmt.Sprint(unreadable))
		}
	}
	// Access rules do not depend on the users, so they are kept (and the
	// server refreshed) even while the users' view is incomplete.
	now := Access{Rules: rules}
	if usersErr == nil {
		changes, err := kopiauser.Sync(ctx, r, desired)
		if err != nil {
			s.noteApplied(err)
			return 0, err
		}
		s.changed = append(s.changed, changes...)
		if len(changes) > 0 {
			s.refreshPending = true
			added, updated, deleted := count(changes)
			s.opts.Log.Info("users written", "users", len(desired), "added", added, "updated", updated, "deleted", deleted)
		}
		now.Users = desired
	} else if s.inForce != nil {
		now.Users = s.inForce.Users
	}
	s.noteApplied(nil)
	applied := usersErr == nil || s.inForce != nil
	revoked := Revocations(s.inForce, now, s.changed, s.removed)
	if s.inForce == nil && usersErr == nil {
		// Until now the server enforced whatever the repository held.
		revoked = append(revoked, Revocation{Users: "*@*", Reason: RevokedBeforeFirstSync, Why: "opened before this pod first synced its users"})
	}
	// Another replica may have written the change: this pod's server
	// learns of it by its own refresh all the same.
	if applied && !s.inForce.equal(&now) {
		s.refreshPending = true
	}
	if applied {
		s.writeCredentials(now.Users)
	}
	if s.refreshPending {
		if err := s.opts.Server.Refresh(ctx); err != nil {
			return 0, fmt.Errorf("repository written, but the server did not refresh: %w", err)
		}
		s.refreshPending = false
	}
	// Once the server enforces the new access, the sessions opened under
	// what it took away end, and reconnect under it.
	s.endSessions(revoked)
	s.changed, s.removed = nil, nil
	if applied {
		s.inForce = &now
		handed := s.handedAfterRefresh(ctx)
		s.mu.Lock()
		s.enforced = now.Users
		s.handed = handed
		s.mu.Unlock()
	}
	if usersErr == nil {
		s.listed = desired
		s.decoyVersion.Store(int32(commonVersion(desired)))
		// What the gate remembers of users no longer listed is of no use:
		// it could never match again (Admits refuses them first).
		s.verifier.Retain(func(user string) bool { _, ok := desired[user]; return ok })
	}
	// Reported once the server no longer applies them (a refresh reloads
	// its ACLs), so that what the report says is already true.
	s.reportForeign(s.unreported)
	s.unreported = nil
	if usersErr != nil {
		return 0, usersErr
	}
	if policiesErr != nil {
		return 0, policiesErr
	}
	return len(desired), nil
}

// writeCredentials writes the credentials of users into HtpasswdFile when
// it holds other users, and has the server refresh so that it loads them.
// Should the write fail, the gate hands no credential until one succeeds,
// and the server verifies every password itself, as without the file.
func (s *Syncer) writeCredentials(users map[string]identity.Hash) {
	if s.opts.HtpasswdFile == "" {
		return
	}
	if s.written != nil && len(s.written) == len(users) && allIn(users, s.written) {
		return
	}
	s.generation++
	if err := logins.WriteFile(s.opts.HtpasswdFile, s.credentials.Htpasswd(slices.Collect(maps.Keys(users)), s.generation)); err != nil {
		s.opts.Log.Error(err, "the gate's credentials for the Kopia server not written: the server verifies every password itself meanwhile")
		s.written = nil
		s.mu.Lock()
		s.handed = nil
		s.mu.Unlock()
		return
	}
	s.written = make(map[string]bool, len(users))
	for user := range users {
		s.written[user] = true
	}
	s.refreshPending = true
}

// commonVersion is the hash version most of users have (the lowest of
// those tied; scrypt's for none): the BSLS's own, unless most hashes
// predate a change of it.
func commonVersion(users map[string]identity.Hash) identity.HashVersion {
	counts := map[identity.HashVersion]int{}
	for _, h := range users {
		counts[h.Version]++
	}
	best, most := identity.Scrypt, 0
	for _, v := range slices.Sorted(maps.Keys(counts)) {
		if counts[v] > most {
			best, most = v, counts[v]
		}
	}
	return best
}

// handedAfterRefresh returns the users whose credentials the gate may
// hand the server: those of the file written last once the server is seen
// to have loaded it, none before. Kopia's refresh answers OK even when its
// repository's refresh failed before it reloaded the file; a credential it
// did not load would refuse every guest's login, where the guest's own
// password still opens the session. Until then, the next pass refreshes
// again.
func (s *Syncer) handedAfterRefresh(ctx context.Context) map[string]bool {
	if s.opts.HtpasswdFile == "" {
		return nil
	}
	if s.written == nil {
		GateCredentialsLoaded.Set(0)
		return nil
	}
	if s.loaded != s.generation {
		ok, err := s.opts.Server.Accepts(ctx, logins.CheckUser, s.credentials.Check(s.generation))
		if err != nil || !ok {
			s.refreshPending = true
			GateCredentialsLoaded.Set(0)
			s.opts.Log.Info("the Kopia server has not loaded the gate's credentials; guests' passwords go on to it until it has", "generation", s.generation, "error", fmt.Sprint(err))
			return nil
		}
		s.loaded = s.generation
	}
	GateCredentialsLoaded.Set(1)
	return s.written
}

// allIn is whether every user of users is in set.
func allIn(users map[string]identity.Hash, set map[string]bool) bool {
	for user := range users {
		if !set[user] {
			return false
		}
	}
	return true
}

// reportForeign tells the admin about ACL manifests guestbackup removed:
// a log line each, the counter, and one Warning Event on the BSLS.
func (s *Syncer) reportForeign(foreign []kopiauser.ForeignACL) {
	if len(foreign) == 0 {
		return
	}
	descriptions := make([]string, len(foreign))
	for i, f := range foreign {
		descriptions[i] = f.String()
		s.opts.Log.Info("removed an ACL manifest guestbackup did not write", "acl", f.String())
	}
	ForeignACLsRemoved.Add(float64(len(foreign)))
	s.warn(ReasonForeignACLRemoved,
		"Removed %d ACL manifest(s) guestbackup did not write; a guest or a holder of the repository password tried to change access: %s",
		len(foreign), strings.Join(descriptions, "; "))
}

// reportRetention tells the admin about a failed retention run: a log line
// and the counter each time, a Warning Event when the failure is new.
func (s *Syncer) reportRetention(err error) {
	if err == nil {
		s.retentionErr = ""
		return
	}
	RetentionFailures.Inc()
	s.opts.Log.Error(err, "retention not applied", "retryIn", s.opts.RetentionInterval)
	if err.Error() == s.retentionErr {
		return
	}
	s.retentionErr = err.Error()
	s.warn(ReasonRetentionFailed,
		"Retention on the server's clock failed, so no snapshot is expired until it runs again (every %s): %v",
		s.opts.RetentionInterval, err)
}

// warn records a Warning Event on the BSLS, when there is a recorder.
func (s *Syncer) warn(reason, format string, args ...any) {
	s.event(corev1.EventTypeWarning, reason, format, args...)
}

// event records an Event on the BSLS, when there is a recorder.
func (s *Syncer) event(eventType, reason, format string, args ...any) {
	if s.opts.Events == nil {
		return
	}
	ref := &corev1.ObjectReference{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "BackupStorageLocationServer",
		Namespace: s.opts.Namespace, Name: s.opts.BSLS, UID: s.opts.BSLSUID,
	}
	s.opts.Events.Eventf(ref, eventType, reason, format, args...)
}

// applyRetention expires snapshots by the admin's retention on the
// server's clock.
func (s *Syncer) applyRetention(ctx context.Context) error {
	if err := s.opts.Repository.Refresh(ctx); err != nil {
		return fmt.Errorf("refresh repository: %w", err)
	}
	expired, err := retention.Apply(ctx, s.opts.Repository, s.opts.Retention)
	if err != nil {
		return err
	}
	if len(expired) > 0 {
		SnapshotsExpired.Add(float64(len(expired)))
		s.opts.Log.Info("snapshots expired by the admin's retention on the server's clock", "snapshots", len(expired))
		if err := s.opts.Server.Refresh(ctx); err != nil {
			return fmt.Errorf("snapshots expired, but the server did not refresh: %w", err)
		}
	}
	return nil
}

// watchShards watches each users Secret by name, so that the server's Role
// needs list and watch only on those names, and returns a lister over
// them once every watch has listed.
func (s *Syncer) watchShards(ctx context.Context) (corelisters.SecretNamespaceLister, func(), error) {
	selector := labels.SelectorFromSet(labels.Set{userset.Label: s.opts.BSLS}).String()
	stopCh := make(chan struct{})
	var wg sync.WaitGroup
	stop := func() { close(stopCh); wg.Wait() }
	lister := shardLister{namespace: s.opts.Namespace, stores: map[string]cache.Store{}}
	synced := make([]cache.InformerSynced, 0, userset.Shards)
	secrets := s.opts.Client.CoreV1().Secrets(s.opts.Namespace)
	for shard := range userset.Shards {
		name := userset.SecretName(s.opts.BSLS, shard)
		byName := func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
			o.LabelSelector = selector
		}
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				byName(&o)
				return secrets.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				byName(&o)
				return secrets.Watch(ctx, o)
			},
		}
		informer := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
		if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { s.poke(); s.polls.signal(shard) },
			UpdateFunc: func(old, o any) {
				s.poke()
				if requestsOf(old) != requestsOf(o) {
					s.polls.signal(shard)
				}
			},
			DeleteFunc: func(any) { s.poke(); s.polls.signal(shard) },
		}); err != nil {
			return nil, stop, fmt.Errorf("watch users Secret %s: %w", name, err)
		}
		lister.stores[name] = informer.GetStore()
		synced = append(synced, informer.HasSynced)
		wg.Add(1)
		go func() { defer wg.Done(); informer.Run(stopCh) }()
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil, stop, fmt.Errorf("list users Secrets of %s/%s: %w", s.opts.Namespace, s.opts.BSLS, ctx.Err())
	}
	return lister, stop, nil
}

// shardLister finds the users Secrets in the stores of their watches, by
// name.
type shardLister struct {
	namespace string
	stores    map[string]cache.Store
}

var _ corelisters.SecretNamespaceLister = shardLister{}

// Get returns the users Secret name, as its watch last saw it.
func (l shardLister) Get(name string) (*corev1.Secret, error) {
	notFound := apierrors.NewNotFound(corev1.Resource("secrets"), name)
	store, ok := l.stores[name]
	if !ok {
		return nil, notFound
	}
	obj, exists, err := store.GetByKey(l.namespace + "/" + name)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, notFound
	}
	return obj.(*corev1.Secret), nil
}

// List returns the users Secrets that match selector.
func (l shardLister) List(selector labels.Selector) ([]*corev1.Secret, error) {
	var out []*corev1.Secret
	for _, store := range l.stores {
		for _, obj := range store.List() {
			if s := obj.(*corev1.Secret); selector.Matches(labels.Set(s.Labels)) {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// DesiredUsers merges the users and the restore grants of every shard. It
// fails, so that nothing is deleted, while a shard is missing or
// malformed.
func DesiredUsers(lister corelisters.SecretNamespaceLister, bsls string) (map[string]identity.Hash, []userset.Grant, error) {
	desired := map[string]identity.Hash{}
	var grants []userset.Grant
	for shard := range userset.Shards {
		name := userset.SecretName(bsls, shard)
		secret, err := lister.Get(name)
		if err != nil {
			return nil, nil, fmt.Errorf("users Secret %s: %w (the controller writes all %d shards before users are synced)", name, err, userset.Shards)
		}
		users, err := decodeShard(secret, shard)
		if err != nil {
			return nil, nil, err
		}
		for user, h := range users {
			desired[user] = h
		}
		g, err := userset.DecodeGrants(secret.Data[userset.GrantsKey])
		if err != nil {
			return nil, nil, fmt.Errorf("users Secret %s, key %s: %w", secret.Name, userset.GrantsKey, err)
		}
		grants = append(grants, g...)
	}
	return desired, grants, nil
}

func decodeShard(secret *corev1.Secret, shard int) (map[string]identity.Hash, error) {
	users, err := userset.Decode(secret.Data[userset.Key])
	if err != nil {
		return nil, fmt.Errorf("users Secret %s, key %s: %w", secret.Name, userset.Key, err)
	}
	for user := range users {
		if userset.ShardOf(user) != shard {
			return nil, fmt.Errorf("users Secret %s lists %s, which belongs in shard %d", secret.Name, user, userset.ShardOf(user))
		}
	}
	return users, nil
}

func count(changes []kopiauser.Change) (added, updated, deleted int) {
	for _, c := range changes {
		switch c.Op {
		case kopiauser.OpAdd:
			added++
		case kopiauser.OpUpdate:
			updated++
		case kopiauser.OpDelete:
			deleted++
		}
	}
	return added, updated, deleted
}

// publishActivity reads the snapshots written since the last call and
// publishes what changed: the guests' activity, then their catalogues.
func (s *Syncer) publishActivity(ctx context.Context) error {
	if err := s.opts.Repository.Refresh(ctx); err != nil {
		return fmt.Errorf("refresh repository: %w", err)
	}
	seen := s.activity.Seen()
	if _, err := s.activity.Scan(ctx, s.opts.Repository); err != nil {
		return err
	}
	if s.scanned {
		SnapshotsCreated.Add(float64(s.activity.Seen() - seen))
	}
	s.scanned = true
	counts, err := repostats.CountSnapshots(ctx, s.opts.Repository)
	if err != nil {
		return err
	}
	s.stats.SetSources(counts)
	s.mu.Lock()
	reports := s.reports
	s.reports = nil
	s.mu.Unlock()
	for user, r := range reports {
		s.activity.Report(user, r)
	}
	s.mu.Lock()
	lister := s.lister
	s.mu.Unlock()
	keep, asked := s.askedRequests(lister)
	if asked != s.asked && keep != nil {
		// Results of requests no longer asked go from every shard, though
		// this pod has nothing new to write there.
		s.activity.Republish()
	}
	if err := s.activity.Publish(ctx, s.opts.Client.CoreV1().ConfigMaps(s.opts.Namespace), s.opts.BSLS, keep); err != nil {
		return err
	}
	if keep != nil {
		s.asked = asked
	}
	// The catalogues right after the activity, which the audit reads
	// with them, and both before the dry runs, which none may hold up.
	err = s.activity.PublishCatalogues(ctx, s.opts.Client.CoreV1().ConfigMaps(s.opts.Namespace), s.opts.BSLS)
	s.carryDryRuns(ctx, lister)
	if err != nil {
		// The activity is out: only the snapshot lists lag.
		return fmt.Errorf("the activity is published, but not every catalogue: %w", err)
	}
	return nil
}

// measureRepository measures the repository's storage and index for
// /metrics.
func (s *Syncer) measureRepository(ctx context.Context) error {
	dr, ok := s.opts.Repository.(repo.DirectRepository)
	if !ok {
		return errors.New("the repository is not opened directly, so its storage cannot be listed")
	}
	if err := dr.Refresh(ctx); err != nil {
		return fmt.Errorf("refresh repository: %w", err)
	}
	stats, err := repostats.Measure(ctx, dr)
	if err != nil {
		return err
	}
	s.stats.SetStats(stats)
	s.opts.Log.V(1).Info("repository measured", "storedBytes", stats.StoredBytes, "blobs", stats.Blobs, "logicalBytes", stats.LogicalBytes, "took", stats.Took)
	return nil
}

// endUnwritten ends, after a sync that failed, the sessions of the users
// the users Secrets no longer list, or list with another password, since
// sessions were last ended for them. The gate refuses such users new
// sessions already (Admits), but the Kopia server, which the failed sync
// could not update, would let the open ones go on. An incomplete view of
// the Secrets revokes nothing, as it deletes nothing.
func (s *Syncer) endUnwritten(lister corelisters.SecretNamespaceLister) {
	desired, _, err := DesiredUsers(lister, s.opts.BSLS)
	if err != nil {
		return
	}
	last := s.listed
	if last == nil && s.inForce != nil {
		last = s.inForce.Users
	}
	s.listed = desired
	if last == nil {
		return
	}
	s.endSessions(Revocations(&Access{Users: last}, Access{Users: desired}, nil, nil))
}

// Errors of Admits.
var (
	errNotListed       = errors.New("not a user of this server: the users Secrets do not list it")
	errNotCurrent      = errors.New("not its current password: the users Secrets hold another one, which user sync has not written into the repository yet")
	errWrongPassword   = errors.New("not its password")
	errShardUnreadable = errors.New("its users Secret cannot be read")
)

// Admits returns the password to hand the Kopia server when user may open
// a session with password now, by the users Secrets rather than the
// repository (sessiongate.Directory): a user they do not list is refused,
// whatever the repository still holds, after as long as a wrong password
// takes.
//
// With HtpasswdFile, where the server enforces the hash the Secrets list
// and has loaded the user's credential, the password is verified here (on
// any free core, from memory for a password verified against this very
// hash before) and the server gets the credential. Where the hash the
// Secrets list is not the one the server enforces (a rotation user sync
// could not write yet, or before its first sync), the password is verified
// here and handed on as it is, so that the server verifies it too;
// elsewhere, without the file, the server alone verifies it, as it would
// without the gate. While the user's shard is missing or does not parse,
// the repository decides, as user sync deletes nobody then (a new cluster
// attached to old storage); until the Secrets are first listed, nobody is
// admitted.
func (s *Syncer) Admits(ctx context.Context, user, password string) (string, error) {
	s.mu.Lock()
	lister, enforced, handed := s.lister, s.enforced, s.handed
	s.mu.Unlock()
	h, err := s.listedHash(lister, user)
	switch {
	case errors.Is(err, errShardUnreadable):
		return password, nil
	case errors.Is(err, errNotListed):
		// As long as a wrong password takes, as Kopia does for a user it
		// does not know: the answer's time tells no one who is listed.
		if err := s.verifier.Unknown(ctx, identity.HashVersion(s.decoyVersion.Load()), password); err != nil {
			return "", err
		}
		return "", errNotListed
	case err != nil:
		return "", err
	}
	have, ok := enforced[user]
	inForce := ok && have.Equal(h)
	if inForce && !handed[user] {
		return password, nil
	}
	matched, err := s.verifier.Verify(ctx, user, h, password)
	switch {
	case err != nil:
		return "", err
	case !matched && inForce:
		return "", errWrongPassword
	case !matched:
		return "", errNotCurrent
	case inForce:
		return s.credentials.For(user), nil
	}
	return password, nil
}

// Authenticate reports whether password is user's, by the hash the users
// Secrets hold for it: the one the repository is synced to. It verifies
// as Admits does, on any free core and from memory for a password it
// verified before; a user they do not list costs a hash all the same.
func (s *Syncer) Authenticate(user, password string) bool {
	s.mu.Lock()
	lister := s.lister
	s.mu.Unlock()
	h, err := s.listedHash(lister, user)
	if err != nil {
		_ = s.verifier.Unknown(context.Background(), identity.HashVersion(s.decoyVersion.Load()), password)
		return false
	}
	matched, err := s.verifier.Verify(context.Background(), user, h, password)
	return err == nil && matched
}

// listedHash is the password hash the users Secrets list for user.
func (s *Syncer) listedHash(lister corelisters.SecretNamespaceLister, user string) (identity.Hash, error) {
	if lister == nil {
		return identity.Hash{}, errNotSynced
	}
	if err := identity.ValidateUsername(user); err != nil {
		return identity.Hash{}, err
	}
	shard := userset.ShardOf(user)
	secret, err := lister.Get(userset.SecretName(s.opts.BSLS, shard))
	if err != nil {
		return identity.Hash{}, fmt.Errorf("%w: %w", errShardUnreadable, err)
	}
	users, err := decodeShard(secret, shard)
	if err != nil {
		return identity.Hash{}, fmt.Errorf("%w: %w", errShardUnreadable, err)
	}
	h, ok := users[user]
	if !ok {
		return identity.Hash{}, errNotListed
	}
	return h, nil
}

// Report keeps a guest's report for the next publication of its activity,
// which it brings forward.
func (s *Syncer) Report(user string, r activity.Report) {
	s.mu.Lock()
	if s.reports == nil {
		s.reports = map[string]activity.Report{}
	}
	s.reports[user] = r
	s.mu.Unlock()
	s.queue.Add(publishActivity)
}
