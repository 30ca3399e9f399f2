package usersync

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corelisters "k8s.io/client-go/listers/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/serverpod/activityscan"
	"github.com/guestbackup/guestbackup/pkg/serverpod/clientserver"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

var _ clientserver.Requests = (*Syncer)(nil)

// Pending returns the requests the users Secrets address to user that it
// has not finished: what its guest's poll gets. A request it finished
// stays listed until the controller has recorded the result, and is not
// handed out again meanwhile.
func (s *Syncer) Pending(user string) ([]userset.Request, error) {
	requests, err := s.listedRequests(user)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.DeleteFunc(requests, func(r userset.Request) bool {
		res, ok := s.results[user][r.UID]
		return ok && res.Ended != nil
	}), nil
}

// listedRequests are the requests the users Secret of user's shard
// addresses to it.
func (s *Syncer) listedRequests(user string) ([]userset.Request, error) {
	if err := identity.ValidateUsername(user); err != nil {
		return nil, err
	}
	s.mu.Lock()
	lister := s.lister
	s.mu.Unlock()
	all, err := shardRequests(lister, s.opts.BSLS, userset.ShardOf(user))
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(r userset.Request) bool { return r.User != user }), nil
}

// shardRequests are the requests the users Secret of shard lists.
func shardRequests(lister corelisters.SecretNamespaceLister, bsls string, shard int) ([]userset.Request, error) {
	if lister == nil {
		return nil, errNotSynced
	}
	name := userset.SecretName(bsls, shard)
	secret, err := lister.Get(name)
	if err != nil {
		return nil, fmt.Errorf("users Secret %s: %w", name, err)
	}
	requests, err := userset.DecodeRequests(secret.Data[userset.RequestsKey])
	if err != nil {
		return nil, fmt.Errorf("users Secret %s, key %s: %w", name, userset.RequestsKey, err)
	}
	return requests, nil
}

// Result records where user's guest is with its request uid. An ending
// is checked against the repository: the request's snapshots are those
// it holds under user's identity with the request's tag, and a success
// that left a path without one is recorded as the failure it is.
func (s *Syncer) Result(ctx context.Context, user, uid, phase, message string) error {
	requests, err := s.listedRequests(user)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(requests, func(r userset.Request) bool { return r.UID == uid })
	if i < 0 {
		return clientserver.ErrUnknownRequest
	}
	now := s.now()
	res := activity.Result{UID: uid, Phase: phase, Message: message, Started: now}
	s.mu.Lock()
	if prev, ok := s.results[user][uid]; ok {
		if prev.Ended != nil {
			s.mu.Unlock()
			return nil // answered already: a retry of the same ending changes nothing
		}
		res.Started = prev.Started
	}
	s.mu.Unlock()
	if phase != string(v1alpha1.PhaseRunning) {
		res.Ended = &now
		// One at a time: each refreshes the repository's view.
		s.verifying.Lock()
		res.Snapshots, err = s.requestSnapshots(ctx, user, uid)
		s.verifying.Unlock()
		if err != nil {
			return err
		}
		verify(&res, requests[i])
	}
	s.mu.Lock()
	if s.results == nil {
		s.results = map[string]map[string]activity.Result{}
	}
	if s.results[user] == nil {
		s.results[user] = map[string]activity.Result{}
	}
	s.results[user][uid] = res
	s.mu.Unlock()
	s.queue.Add(publishActivity)
	return nil
}

// requestSnapshots reads the snapshots of request uid from the repository,
// refreshed first: the guest wrote them through the Kopia server, whose
// writes this process's view of the repository has not seen yet.
func (s *Syncer) requestSnapshots(ctx context.Context, user, uid string) ([]activity.Snapshot, error) {
	if err := s.opts.Repository.Refresh(ctx); err != nil {
		return nil, fmt.Errorf("refresh repository: %w", err)
	}
	return activityscan.RequestSnapshots(ctx, s.opts.Repository, user, uid)
}

// verify makes res say what the repository holds: a success without a
// snapshot of each path the request names is a failure, whatever the
// guest said.
func verify(res *activity.Result, r userset.Request) {
	if res.Phase != string(v1alpha1.PhaseSucceeded) {
		return
	}
	var missing []string
	for _, p := range r.Paths {
		if !slices.ContainsFunc(res.Snapshots, func(sn activity.Snapshot) bool { return sn.Path == p }) {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		res.Phase = string(v1alpha1.PhaseFailed)
		res.Message = fmt.Sprintf("the guest reported success, but the repository holds no snapshot of %s for this request", strings.Join(missing, ", "))
	}
}

// publishResults puts each guest's results into its activity, dropping
// those whose request the users Secrets no longer list (the controller
// recorded them).
func (s *Syncer) publishResults(lister corelisters.SecretNamespaceLister) {
	listed := map[string]bool{}
	for shard := range userset.Shards {
		requests, err := shardRequests(lister, s.opts.BSLS, shard)
		if err != nil {
			return // nothing dropped while a shard cannot be read
		}
		for _, r := range requests {
			listed[r.User+" "+r.UID] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for user, byUID := range s.results {
		maps.DeleteFunc(byUID, func(uid string, _ activity.Result) bool { return !listed[user+" "+uid] })
		results := slices.SortedFunc(maps.Values(byUID), func(a, b activity.Result) int { return strings.Compare(a.UID, b.UID) })
		s.activity.SetResults(user, results)
		if len(byUID) == 0 {
			delete(s.results, user)
		}
	}
}

// now is the time on the Syncer's clock, to the second.
func (s *Syncer) now() time.Time {
	return s.opts.Clock.Now().UTC().Truncate(time.Second)
}
