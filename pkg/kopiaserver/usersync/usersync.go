// Package usersync is the user-sync container of a Kopia server pod. It
// watches its BSLS's users Secrets, applies the users they list to the
// repository by diff (add, change, delete; never re-hashing a password), and
// makes the running server see the change at once through its control API.
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
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// Refresher makes a running Kopia server re-read the repository.
type Refresher interface {
	Refresh(ctx context.Context) error
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
	// Server is refreshed after every change.
	Server Refresher
	// AppendOnly keeps the repository's guestbackup ACLs at
	// kopiauser.AppendOnlyACLs, so guests cannot delete snapshots; when
	// false, guestbackup's ACLs are removed and Kopia's defaults apply.
	AppendOnly bool
	// ActivityInterval is how often the repository's new snapshots are
	// read and published in the activity ConfigMaps; 0: never.
	ActivityInterval time.Duration
	// Resync is how often the repository is compared with the Secrets even
	// when no Secret changed, to undo changes made by other writers.
	// Default: 5 minutes.
	Resync time.Duration
	// RetryAfter is the first delay after a failed sync; it doubles up to
	// Resync. Default: 1 second.
	RetryAfter time.Duration
	Log        logr.Logger
}

// Syncer keeps a repository's users equal to the users Secrets.
type Syncer struct {
	opts    Options
	trigger chan struct{}

	// activity belongs to Run's goroutine.
	activity *activity.Scanner

	mu     sync.Mutex
	status error
	users  int

	// refreshPending is set when users were written but the server has not
	// confirmed a refresh since (it may not be listening yet): the next
	// sync refreshes even when it finds nothing to change. Only Run's
	// goroutine touches it.
	refreshPending bool
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
	return &Syncer{opts: opts, trigger: make(chan struct{}, 1), status: errNotSynced, activity: activity.NewScanner()}
}

// Ready returns nil once the repository holds exactly the desired users,
// else why it does not.
func (s *Syncer) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Users is the number of users in the last successful sync.
func (s *Syncer) Users() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users
}

func (s *Syncer) setStatus(err error, users int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = err
	if err == nil {
		s.users = users
	}
}

func (s *Syncer) poke() {
	select {
	case s.trigger <- struct{}{}:
	default: // a sync is already pending; it will see this change too
	}
}

// Run watches the users Secrets and syncs until ctx ends.
func (s *Syncer) Run(ctx context.Context) error {
	selector := labels.SelectorFromSet(labels.Set{userset.Label: s.opts.BSLS}).String()
	factory := informers.NewSharedInformerFactoryWithOptions(s.opts.Client, 0,
		informers.WithNamespace(s.opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	informer := factory.Core().V1().Secrets()
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.poke() },
		UpdateFunc: func(any, any) { s.poke() },
		DeleteFunc: func(any) { s.poke() },
	}); err != nil {
		return fmt.Errorf("watch users Secrets: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return fmt.Errorf("list users Secrets of %s/%s: %w", s.opts.Namespace, s.opts.BSLS, ctx.Err())
	}
	lister := informer.Lister().Secrets(s.opts.Namespace)

	delay := s.opts.RetryAfter
	timer := time.NewTimer(0)
	defer timer.Stop()
	var activityTick <-chan time.Time
	if s.opts.ActivityInterval > 0 {
		ticker := time.NewTicker(s.opts.ActivityInterval)
		defer ticker.Stop()
		activityTick = ticker.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-activityTick:
			if err := s.publishActivity(ctx); err != nil {
				s.opts.Log.Error(err, "guest activity not published", "retryIn", s.opts.ActivityInterval)
			}
			continue
		case <-s.trigger:
		case <-timer.C:
		}
		users, err := s.syncOnce(ctx, lister)
		s.setStatus(err, users)
		next := s.opts.Resync
		if err != nil {
			s.opts.Log.Error(err, "user sync failed", "retryIn", delay)
			next, delay = delay, min(2*delay, s.opts.Resync)
		} else {
			delay = s.opts.RetryAfter
		}
		timer.Reset(next)
	}
}

// syncOnce reads the complete desired set, applies it and returns how many
// users the repository now has.
func (s *Syncer) syncOnce(ctx context.Context, lister corelisters.SecretNamespaceLister) (int, error) {
	desired, err := DesiredUsers(lister, s.opts.BSLS)
	if err != nil {
		return 0, err
	}
	r := s.opts.Repository
	// Another writer (an admin's `kopia server user add`) may have changed users.
	if err := r.Refresh(ctx); err != nil {
		return 0, fmt.Errorf("refresh repository: %w", err)
	}
	changes, err := kopiauser.Sync(ctx, r, desired)
	if err != nil {
		return 0, err
	}
	if len(changes) > 0 {
		s.refreshPending = true
		added, updated, deleted := count(changes)
		s.opts.Log.Info("users written", "users", len(desired), "added", added, "updated", updated, "deleted", deleted)
	}
	var acls []kopiauser.ACL
	if s.opts.AppendOnly {
		acls = kopiauser.AppendOnlyACLs()
	}
	aclsChanged, err := kopiauser.SyncACLs(ctx, r, acls)
	if err != nil {
		return 0, err
	}
	if aclsChanged {
		s.refreshPending = true
		s.opts.Log.Info("access rules written", "appendOnly", s.opts.AppendOnly)
	}
	if s.refreshPending {
		if err := s.opts.Server.Refresh(ctx); err != nil {
			return 0, fmt.Errorf("users written, but the server did not refresh: %w", err)
		}
		s.refreshPending = false
	}
	return len(desired), nil
}

// DesiredUsers merges the users of every shard. It fails, so that nothing is
// deleted, while a shard is missing or malformed.
func DesiredUsers(lister corelisters.SecretNamespaceLister, bsls string) (map[string]kopiauser.Hash, error) {
	desired := map[string]kopiauser.Hash{}
	for shard := range userset.Shards {
		name := userset.SecretName(bsls, shard)
		secret, err := lister.Get(name)
		if err != nil {
			return nil, fmt.Errorf("users Secret %s: %w (the controller writes all %d shards before users are synced)", name, err, userset.Shards)
		}
		users, err := decodeShard(secret, shard)
		if err != nil {
			return nil, err
		}
		for user, h := range users {
			desired[user] = h
		}
	}
	return desired, nil
}

func decodeShard(secret *corev1.Secret, shard int) (map[string]kopiauser.Hash, error) {
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
// publishes what changed.
func (s *Syncer) publishActivity(ctx context.Context) error {
	if err := s.opts.Repository.Refresh(ctx); err != nil {
		return fmt.Errorf("refresh repository: %w", err)
	}
	if _, err := s.activity.Scan(ctx, s.opts.Repository); err != nil {
		return err
	}
	return s.activity.Publish(ctx, s.opts.Client.CoreV1().ConfigMaps(s.opts.Namespace), s.opts.BSLS)
}
