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

	corev1 "k8s.io/api/core/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/serverpod/activityscan"
	"github.com/guestbackup/guestbackup/pkg/serverpod/clientserver"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

var _ clientserver.Requests = (*Syncer)(nil)

// Pending returns the requests the users Secrets address to user that it
// has not finished, as far as this pod knows, oldest first: what its
// guest's poll gets, and the order the guest carries them out in.
// A request it finished stays listed until the controller has recorded
// the result, and this pod does not hand it out again meanwhile; another
// replica, which did not take the ending, may, and the guest's own record
// of what it answered keeps it from running twice.
func (s *Syncer) Pending(user string) ([]userset.Request, error) {
	requests, err := s.listedRequests(user)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A dry run is the server pod's to list (carryDryRuns).
	requests = slices.DeleteFunc(requests, func(r userset.Request) bool { return s.ended[r.UID] || r.DryRun })
	slices.SortFunc(requests, userset.Oldest)
	return requests, nil
}

// Changed is closed when the requests the users Secret of user's shard
// lists change: a poll held for user looks again (clientserver).
func (s *Syncer) Changed(user string) <-chan struct{} {
	return s.polls.of(userset.ShardOf(user))
}

// shardSignals tell, per shard, that the requests its users Secret lists
// changed: each signal closes the shard's channel, which the next of
// replaces. Its zero value is ready.
type shardSignals struct {
	mu sync.Mutex
	ch [userset.Shards]chan struct{}
}

// of is shard's channel, closed at its next signal.
func (c *shardSignals) of(shard int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch[shard] == nil {
		c.ch[shard] = make(chan struct{})
	}
	return c.ch[shard]
}

// signal closes shard's channel.
func (c *shardSignals) signal(shard int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch[shard] != nil {
		close(c.ch[shard])
		c.ch[shard] = nil
	}
}

// requestsOf is what users Secret o (an informer's object) lists as
// requests.
func requestsOf(o any) string {
	if s, ok := o.(*corev1.Secret); ok {
		return string(s.Data[userset.RequestsKey]) + string(s.Data[userset.JobRequestsKey])
	}
	return ""
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
	all, err := s.decoded.of(lister, s.opts.BSLS, userset.ShardOf(user))
	if err != nil {
		return nil, err
	}
	var own []userset.Request
	for _, r := range all {
		if r.User == user {
			own = append(own, r)
		}
	}
	return own, nil
}

// requestsCache keeps each users Secret's requests as last decoded, by the
// Secret's version: every poll of a shard's guests reads them, and a
// change of them wakes every poll the shard's guests hold at once.
type requestsCache struct {
	mu sync.Mutex
	by map[string]decodedRequests
}

type decodedRequests struct {
	version  string
	requests []userset.Request
}

// of is the requests the users Secret of shard lists, decoded once per
// version of the Secret. The slice is shared: read it only.
func (c *requestsCache) of(lister corelisters.SecretNamespaceLister, bsls string, shard int) ([]userset.Request, error) {
	secret, err := usersSecret(lister, bsls, shard)
	if err != nil {
		return nil, err
	}
	name := secret.Name
	c.mu.Lock()
	d, ok := c.by[name]
	c.mu.Unlock()
	if ok && d.version == secret.ResourceVersion && d.version != "" {
		return d.requests, nil
	}
	requests, err := secretRequests(secret)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]decodedRequests{}
	}
	c.by[name] = decodedRequests{version: secret.ResourceVersion, requests: requests}
	return requests, nil
}

// usersSecret is the users Secret of shard, as its watch last saw it.
func usersSecret(lister corelisters.SecretNamespaceLister, bsls string, shard int) (*corev1.Secret, error) {
	if lister == nil {
		return nil, errNotSynced
	}
	name := userset.SecretName(bsls, shard)
	secret, err := lister.Get(name)
	if err != nil {
		return nil, fmt.Errorf("users Secret %s: %w", name, err)
	}
	return secret, nil
}

// secretRequests are the requests users Secret secret lists, the guests'
// and the Jobs'.
func secretRequests(secret *corev1.Secret) ([]userset.Request, error) {
	var all []userset.Request
	for _, key := range []string{userset.RequestsKey, userset.JobRequestsKey} {
		requests, err := userset.DecodeRequests(secret.Data[key])
		if err != nil {
			return nil, fmt.Errorf("users Secret %s, key %s: %w", secret.Name, key, err)
		}
		for _, r := range requests {
			if r.Job != (key == userset.JobRequestsKey) {
				return nil, fmt.Errorf("users Secret %s, key %s: request %s is listed under the other kind's key", secret.Name, key, r.UID)
			}
		}
		all = append(all, requests...)
	}
	return all, nil
}

// Result records where user's guest is with its request uid, in the
// activity ConfigMap of its shard: every replica of the server keeps what
// any of them recorded there (activity.Merge), so an answer is not lost to
// the replica the guest's next connection reaches. An ending is checked
// against the repository: the request's snapshots are those it holds
// under user's identity with the request's tag, and a success that left a
// path without one is recorded as the failure it is. The first ending
// recorded stands.
func (s *Syncer) Result(ctx context.Context, user, uid, phase, message string) error {
	requests, err := s.listedRequests(user)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(requests, func(r userset.Request) bool { return r.UID == uid })
	if i < 0 {
		return clientserver.ErrUnknownRequest
	}
	configMaps := s.opts.Client.CoreV1().ConfigMaps(s.opts.Namespace)
	prev, err := activityscan.PublishedResult(ctx, configMaps, s.opts.BSLS, user, uid)
	if err != nil {
		return err
	}
	switch {
	case prev != nil && prev.Ended != nil:
		s.noteEnded(uid)
		if phase == string(v1alpha1.PhaseRunning) {
			return fmt.Errorf("%w: %s", clientserver.ErrRequestEnded, prev.Message)
		}
		return nil // answered already: a retry of the same ending changes nothing
	case prev != nil && phase == string(v1alpha1.PhaseRunning):
		return nil // known to run: a guest's repeated Running costs no write
	}
	now := s.now()
	res := activity.Result{UID: uid, Phase: phase, Message: message, Started: now}
	running, restore := phase == string(v1alpha1.PhaseRunning), requests[i].Kind == userset.RequestRestore
	switch {
	case requests[i].DryRun:
		// The server pod lists it (carryDryRuns); a guest has nothing to
		// do with it.
		return clientserver.ErrUnknownRequest
	case running && restore:
		// The snapshots it restores from are chosen now, once: the
		// result keeps them for the guest's repeated Running, for any
		// replica, and for the request's status.
		if err := s.planRestore(ctx, requests[i], &res); err != nil {
			return err
		}
	case !running && restore:
		// What a restore wrote is in the guest, which is the owner's
		// own: its word is taken.
		res.Ended = &now
	case !running:
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
	stands, err := activityscan.RecordResult(ctx, configMaps, s.opts.BSLS, user, res)
	if err != nil {
		return err
	}
	if stands.Ended != nil {
		s.noteEnded(uid)
	}
	// The results of requests no longer asked go with the next publish.
	s.queue.Add(publishActivity)
	if running && stands.Ended != nil {
		return fmt.Errorf("%w: %s", clientserver.ErrRequestEnded, stands.Message)
	}
	return nil
}

// Progress records that user's guest (or restore Job) has restored the
// first restored steps of the plan of its running restore uid. What that
// wrote is what the plan's snapshots hold there, as the repository said
// when the restore started: the carrier tells only how far it got. Each
// step is one write of the activity ConfigMap at most, and a request has
// at most userset.MaxRequestPaths of them.
func (s *Syncer) Progress(ctx context.Context, user, uid string, restored int) error {
	requests, err := s.listedRequests(user)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(requests, func(r userset.Request) bool { return r.UID == uid })
	if i < 0 || requests[i].Kind != userset.RequestRestore || requests[i].DryRun {
		return clientserver.ErrUnknownRequest
	}
	configMaps := s.opts.Client.CoreV1().ConfigMaps(s.opts.Namespace)
	prev, err := activityscan.PublishedResult(ctx, configMaps, s.opts.BSLS, user, uid)
	switch {
	case err != nil:
		return err
	case prev == nil:
		// Not started: it has no plan to be part of.
		return clientserver.ErrUnknownRequest
	case prev.Ended != nil:
		s.noteEnded(uid)
		return fmt.Errorf("%w: %s", clientserver.ErrRequestEnded, prev.Message)
	case restored <= prev.Restored || restored > len(prev.Snapshots):
		return nil // no further, or beyond the plan: nothing to record
	}
	res := *prev
	res.Restored = restored
	stands, err := activityscan.RecordResult(ctx, configMaps, s.opts.BSLS, user, res)
	if err != nil {
		return err
	}
	if stands.Ended != nil {
		s.noteEnded(uid)
		return fmt.Errorf("%w: %s", clientserver.ErrRequestEnded, stands.Message)
	}
	return nil
}

// Plan is what the guest of user restores for its request uid, as its
// Running answer recorded it: for each path, the snapshot and the path in
// it (package clientdist's EncodePlan); none for another kind, or before
// the restore started.
func (s *Syncer) Plan(ctx context.Context, user, uid string) ([]clientdist.PlanStep, error) {
	requests, err := s.listedRequests(user)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(requests, func(r userset.Request) bool { return r.UID == uid })
	if i < 0 {
		return nil, clientserver.ErrUnknownRequest
	}
	if requests[i].Kind != userset.RequestRestore {
		return nil, nil
	}
	res, err := activityscan.PublishedResult(ctx, s.opts.Client.CoreV1().ConfigMaps(s.opts.Namespace), s.opts.BSLS, user, uid)
	if err != nil || res == nil {
		return nil, err
	}
	plan := make([]clientdist.PlanStep, len(res.Snapshots))
	for i, sn := range res.Snapshots {
		plan[i] = clientdist.PlanStep{ID: sn.ID, Root: sn.Root, Path: sn.Path}
	}
	return plan, nil
}

// planTimeout bounds how long the server pod chooses and checks what one
// restore restores: a snapshot another guest forged may be as large as it
// likes, and the guest's Running answer waits for the choice.
const planTimeout = 45 * time.Second

// planRestore chooses what restore request r restores from (restorePlan),
// in the repository refreshed first (the snapshot it names may have been
// written through the Kopia server a moment ago), into res: its
// snapshots; for a dry run, the listing and the ending; for a history,
// its path's versions (pathHistory) and the ending; for a restore that
// cannot be carried out, the failure and why.
func (s *Syncer) planRestore(ctx context.Context, r userset.Request, res *activity.Result) error {
	s.verifying.Lock()
	err := s.opts.Repository.Refresh(ctx)
	s.verifying.Unlock()
	if err != nil {
		return fmt.Errorf("refresh repository: %w", err)
	}
	bounded, cancel := context.WithTimeout(ctx, planTimeout)
	defer cancel()
	var (
		plan    []restoreStep
		refused restoreRefusal
	)
	if r.History {
		res.History, refused, err = pathHistory(bounded, s.opts.Repository, r)
	} else {
		plan, refused, err = restorePlan(bounded, s.opts.Repository, r)
	}
	if refused == "" && err == nil && r.DryRun && !r.History {
		res.Listing, refused, err = dryRunListing(bounded, s.opts.Repository, plan, r.Target, r.InPlace)
	}
	switch {
	case ctx.Err() != nil:
		// The guest went, or the pod stops: nothing is decided.
		return ctx.Err()
	case errors.Is(bounded.Err(), context.DeadlineExceeded) && r.History:
		err, refused = nil, restoreRefusal(fmt.Sprintf("listing the versions took longer than %s: list those of fewer snapshots (snapshot.before)", planTimeout))
	case errors.Is(bounded.Err(), context.DeadlineExceeded):
		err, refused = nil, restoreRefusal(fmt.Sprintf("choosing and checking what to restore took longer than %s: restore fewer or smaller paths", planTimeout))
	case err != nil:
		return err
	}
	end := func(phase v1alpha1.RequestPhase, message string) {
		ended := res.Started
		res.Phase, res.Message, res.Ended = string(phase), message, &ended
	}
	res.Snapshots = snapshots(plan)
	switch {
	case refused != "":
		res.Listing, res.History = nil, nil
		end(v1alpha1.PhaseFailed, string(refused))
	case r.History:
		end(v1alpha1.PhaseSucceeded, fmt.Sprintf("listed %d versions of %s: nothing written", len(res.History), r.Paths[0]))
	case r.DryRun:
		end(v1alpha1.PhaseSucceeded, "a dry run: nothing written")
	}
	return nil
}

// dryRunsListed reports whether the users Secrets list a dry run this pod
// has not carried out.
func (s *Syncer) dryRunsListed(lister corelisters.SecretNamespaceLister) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for shard := range userset.Shards {
		requests, _ := s.decoded.of(lister, s.opts.BSLS, shard)
		if slices.ContainsFunc(requests, func(r userset.Request) bool { return r.DryRun && !s.ended[r.UID] }) {
			return true
		}
	}
	return false
}

// carryDryRuns carries out the restores' dry runs the users Secrets list:
// their listing needs the repository alone, so no guest is handed them,
// and a stopped VM's are listed too. Each is done once: its result is
// recorded where every replica reads it, a failure too. One that cannot
// be done now is left for the next pass, and keeps no other from being
// done.
func (s *Syncer) carryDryRuns(ctx context.Context, lister corelisters.SecretNamespaceLister) {
	configMaps := s.opts.Client.CoreV1().ConfigMaps(s.opts.Namespace)
	for shard := range userset.Shards {
		requests, err := s.decoded.of(lister, s.opts.BSLS, shard)
		if err != nil {
			continue
		}
		for _, r := range requests {
			s.mu.Lock()
			done := s.ended[r.UID]
			s.mu.Unlock()
			if !r.DryRun || done {
				continue
			}
			if err := s.carryDryRun(ctx, configMaps, r); err != nil {
				s.opts.Log.Error(err, "dry run not listed; trying again at the next publish", "user", r.User, "uid", r.UID)
				continue
			}
			s.noteEnded(r.UID)
		}
	}
}

// carryDryRun lists dry run r and records it, unless its ending is
// recorded already.
func (s *Syncer) carryDryRun(ctx context.Context, configMaps corev1client.ConfigMapInterface, r userset.Request) error {
	prev, err := activityscan.PublishedResult(ctx, configMaps, s.opts.BSLS, r.User, r.UID)
	if err != nil || prev != nil && prev.Ended != nil {
		return err
	}
	res := activity.Result{UID: r.UID, Started: s.now()}
	if err := s.planRestore(ctx, r, &res); err != nil {
		return err
	}
	_, err = activityscan.RecordResult(ctx, configMaps, s.opts.BSLS, r.User, res)
	return err
}

// noteEnded remembers that request uid has ended, so that Pending no
// longer hands it out.
func (s *Syncer) noteEnded(uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended == nil {
		s.ended = map[string]bool{}
	}
	s.ended[uid] = true
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

// verify makes res say what the repository holds: the newest snapshot of
// each path the request names (a guest may tag any number with the
// request's tag; its result records one per path, as its shard's budget
// counts), and a success without a snapshot of each path is a failure,
// whatever the guest said.
func verify(res *activity.Result, r userset.Request) {
	var kept []activity.Snapshot
	var missing []string
	for _, p := range r.Paths {
		newest := -1
		for i, sn := range res.Snapshots {
			if sn.Path == p {
				newest = i // RequestSnapshots returns them oldest first
			}
		}
		if newest < 0 {
			missing = append(missing, p)
			continue
		}
		kept = append(kept, res.Snapshots[newest])
	}
	res.Snapshots = kept
	if res.Phase != string(v1alpha1.PhaseSucceeded) {
		return
	}
	if len(missing) > 0 {
		res.Phase = string(v1alpha1.PhaseFailed)
		res.Message = fmt.Sprintf("the guest reported success, but the repository holds no snapshot of %s for this request", strings.Join(missing, ", "))
	}
}

// askedRequests reads which requests the users Secrets list, as a keep
// function for activity.Merge (which drops the results of requests this
// pod saw listed and no longer does), and a digest of them that changes
// when they do; nil and "" while a shard cannot be read (nothing is
// dropped then). It forgets the endings of requests no longer listed.
func (s *Syncer) askedRequests(lister corelisters.SecretNamespaceLister) (keep func(user string, r activity.Result) bool, digest string) {
	listed, uids := map[string]bool{}, map[string]bool{}
	for shard := range userset.Shards {
		requests, err := s.decoded.of(lister, s.opts.BSLS, shard)
		if err != nil {
			return nil, ""
		}
		for _, r := range requests {
			listed[r.User+" "+r.UID], uids[r.UID] = true, true
		}
	}
	s.mu.Lock()
	maps.DeleteFunc(s.ended, func(uid string, _ bool) bool { return !uids[uid] })
	if s.seenListed == nil {
		s.seenListed = map[string]bool{}
	}
	maps.Copy(s.seenListed, listed)
	seen := maps.Clone(s.seenListed)
	s.mu.Unlock()
	keys := slices.Sorted(maps.Keys(listed))
	// A request this pod's Secrets do not list yet (its informer trails
	// another pod's) keeps the results that pod recorded: only one seen
	// listed here, then no longer, is one the controller recorded.
	keep = func(user string, r activity.Result) bool { k := user + " " + r.UID; return listed[k] || !seen[k] }
	return keep, strings.Join(keys, "\n") + "\n"
}

// now is the time on the Syncer's clock, to the second.
func (s *Syncer) now() time.Time {
	return s.opts.Clock.Now().UTC().Truncate(time.Second)
}
