// Package integrity verifies, in the server pod that runs the repository's
// maintenance, that what the repository's index promises is still in the
// storage, and heals forward what is not.
//
// Storage can lose a pack (a lifecycle rule, a storage admin's mistake) or
// rot one. Kopia finds neither until someone runs `snapshot verify`, and
// worse, every later snapshot of the same files deduplicates against the
// lost contents and "succeeds" without uploading them. A pass therefore:
//
//  1. lists the storage's packs and checks that every content the index
//     names lies in one of them, whole (cheap: one listing);
//  2. reads back a bounded number of bytes of packs, content by content,
//     through a connection without a cache, so that rot is found by a
//     pass over every pack over days;
//  3. confirms each loss against a fresh index and the storage, and drops
//     the lost contents from the index: writing them again then uploads
//     them, where it would have deduplicated;
//  4. walks the snapshots that reference lost contents, once per
//     directory object, and writes a rehash notice for each guest whose
//     latest snapshot is damaged, so that its client reads every file
//     again at its next snapshot (package rehash);
//  5. publishes what it found for the controller (the RepositoryIntact
//     condition, Events on the VMs) and records Events on the BSLS.
package integrity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/snapshot"
	"k8s.io/utils/clock"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// Reasons of the Events a pass records on the BSLS.
const (
	// ReasonRepositoryDamaged (Warning): a pass found a pack missing, or a
	// content that does not read back; the message names the packs and
	// how many contents were dropped from the index to be uploaded again.
	ReasonRepositoryDamaged = "RepositoryDamaged"
	// ReasonRepositoryIntactAgain (Normal): no snapshot references lost
	// data any more: every guest whose snapshots were damaged uploaded the
	// lost data again.
	ReasonRepositoryIntactAgain = "RepositoryIntactAgain"
	// ReasonSnapshotsSettled (Warning): damaged snapshots that could no
	// longer heal were rewritten, each lost file replaced by a stub
	// (settle.go).
	ReasonSnapshotsSettled = "SnapshotsSettled"
	// ReasonVerificationFailing (Warning): a pass could not complete (the
	// storage did not answer, say); it is tried again at the next one.
	ReasonVerificationFailing = "VerificationFailing"
)

// Defaults of Options.
const (
	DefaultInterval         = 10 * time.Minute
	DefaultReadBytesPerPass = 256 << 20
	DefaultSettleAfter      = 7 * 24 * time.Hour
)

// Reporter receives the Events to record on the BSLS.
type Reporter interface {
	Report(warning bool, reason, message string)
}

// Refresher makes a Kopia server read the repository's index and
// manifests again.
type Refresher interface {
	Refresh(ctx context.Context) error
}

// Publisher receives the state after every pass, for the controller.
type Publisher interface {
	PublishIntegrity(ctx context.Context, s maintenancestate.IntegrityState) error
}

// Options configure a Verifier.
type Options struct {
	// Repository is the maintenance owner's connection: the index it
	// checks, the contents it drops, the snapshots it walks, the notices
	// it writes.
	Repository repo.DirectRepository
	// Reader is a connection to the same repository without a content
	// cache (OpenUncached): what it reads comes from the storage, not
	// from what an earlier read kept.
	Reader repo.DirectRepository
	// Interval is the time between the start of two passes; default
	// DefaultInterval.
	Interval time.Duration
	// ReadBytesPerPass bounds the pack bytes a pass reads back; 0 reads
	// none, negative takes DefaultReadBytesPerPass.
	ReadBytesPerPass int64
	// SettleAfter is how long the repository may stay damaged before
	// the damaged snapshots of guests that have not healed them are
	// settled all the same (settle.go); default DefaultSettleAfter.
	SettleAfter time.Duration
	// Exclusive, when set, is held for a whole pass. Maintenance holds it
	// too: its compaction moves contents between packs, which a pass
	// would otherwise find missing from the pack its index named.
	Exclusive sync.Locker
	// Server, when set, is the pod's Kopia server, refreshed after a pass
	// dropped contents or changed notices: it serves guests from the
	// index and manifests it last read, and would otherwise deduplicate
	// against a dropped content, and hide a notice, until it refreshes.
	Server Refresher
	// Clock is the Verifier's; default the real one.
	Clock   clock.Clock
	Reports Reporter
	Publish Publisher
	Log     logr.Logger
}

// Verifier runs verification passes.
type Verifier struct {
	opts Options
	// Only the goroutine of Run (or the caller of Pass) touches the rest.
	// cursor is the pack the last pass read up to: the next reads on
	// from there, so that passes cover every pack in turn.
	cursor string
	// last is the state last published; walked whether a pass has
	// walked the snapshots since the process started.
	last   maintenancestate.IntegrityState
	walked bool
	// failing is the last failure's message, so that a failure repeating
	// the same way is one Event.
	failing string
	// pending are the contents dropped from the index that it still
	// holds as deleted (see forget).
	pending map[content.ID]loss
	// since is when each damaged source was first found damaged, for
	// SettleAfter.
	since map[snapshot.SourceInfo]time.Time
	// found is what a pass dropped that no complete pass has reported
	// yet: a pass that fails after dropping leaves it to the next one,
	// which finds nothing new in the index.
	found *maintenancestate.IntegrityState
	// refreshDue: the Kopia server was not refreshed after a change.
	refreshDue bool
}

// NewVerifier returns a Verifier; Run starts it.
func NewVerifier(o Options) *Verifier {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.ReadBytesPerPass < 0 {
		o.ReadBytesPerPass = DefaultReadBytesPerPass
	}
	if o.SettleAfter <= 0 {
		o.SettleAfter = DefaultSettleAfter
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Verifier{opts: o}
}

// Run runs a pass at once and then every Interval, until ctx ends.
func (v *Verifier) Run(ctx context.Context) {
	for {
		if _, err := v.Pass(ctx); err != nil && ctx.Err() == nil {
			v.opts.Log.Error(err, "verification pass failed; tried again at the next one", "next", v.opts.Interval)
		}
		select {
		case <-ctx.Done():
			return
		case <-v.opts.Clock.After(v.opts.Interval):
		}
	}
}

// Pass runs one verification pass, publishes its state and reports it.
func (v *Verifier) Pass(ctx context.Context) (maintenancestate.IntegrityState, error) {
	if v.opts.Exclusive != nil {
		v.opts.Exclusive.Lock()
		defer v.opts.Exclusive.Unlock()
	}
	start := v.opts.Clock.Now()
	state, err := v.pass(ctx)
	now := v.opts.Clock.Now().UTC().Truncate(time.Second)
	state.CheckedAt = now
	if err != nil {
		if ctx.Err() != nil {
			return state, err
		}
		// A pass that did not complete says why, and keeps the last
		// complete pass's findings.
		failed := v.last
		failed.CheckedAt, failed.Error = now, err.Error()
		// What the last pass settled was said then.
		failed.Settled = nil
		state = failed
		passFailures.Inc()
	} else {
		// What this pass and any that failed since the last complete
		// one dropped.
		if f := v.found; f != nil {
			state.LostContents, state.MissingPacks, state.DamagedPacks = f.LostContents, f.MissingPacks, f.DamagedPacks
		}
		v.found = nil
		state.VerifiedAt = now
		state.DamagedSince = damagedSince(v.last, state, now)
		if state.DamagedSnapshots > 0 && len(state.MissingPacks)+len(state.DamagedPacks) == 0 {
			// What this pass found is already dropped from the index;
			// the packs an earlier one named still explain the damage.
			state.MissingPacks, state.DamagedPacks = v.last.MissingPacks, v.last.DamagedPacks
		}
		passDuration.Observe(v.opts.Clock.Since(start).Seconds())
	}
	setGauges(state)
	for _, e := range events(v.last, state, v.failing) {
		if v.opts.Reports != nil {
			v.opts.Reports.Report(e.warning, e.reason, e.message)
		}
	}
	v.failing = ""
	if err != nil {
		v.failing = state.Error
	}
	if v.opts.Publish != nil {
		if perr := v.opts.Publish.PublishIntegrity(ctx, state); perr != nil {
			err = errors.Join(err, fmt.Errorf("publish the repository's integrity: %w", perr))
		}
	}
	v.last = state
	return state, err
}

// damagedSince is when the repository turned damaged: kept from the last
// state while it stays so.
func damagedSince(last, now maintenancestate.IntegrityState, at time.Time) time.Time {
	switch {
	case now.DamagedSnapshots == 0 && now.LostContents == 0:
		return time.Time{}
	case !last.DamagedSince.IsZero():
		return last.DamagedSince
	default:
		return at
	}
}

// pass is one pass's work; the state it returns lacks the times Pass sets.
func (v *Verifier) pass(ctx context.Context) (maintenancestate.IntegrityState, error) {
	var state maintenancestate.IntegrityState
	dr := v.opts.Repository
	if err := dr.Refresh(ctx); err != nil {
		return state, fmt.Errorf("refresh the index: %w", err)
	}
	inv, err := takeInventory(ctx, dr)
	if err != nil {
		return state, err
	}
	state.Contents, state.Packs = inv.contents, len(inv.packs)
	suspects := inv.suspects()
	if v.opts.Reader != nil && v.opts.ReadBytesPerPass > 0 {
		read, err := v.readBack(ctx, inv)
		if err != nil {
			return state, err
		}
		suspects = append(suspects, read.suspects...)
		state.ReadPacks, state.ReadBytes = read.packs, read.bytes
	}
	lost, err := v.confirm(ctx, suspects)
	if err != nil {
		return state, err
	}
	if 2*len(lost) > inv.contents {
		// A storage that answers wrongly (another prefix, a listing cut
		// short, a quorum that lost its way) looks like a mass loss:
		// dropping would turn its passing trouble into a real one.
		return state, fmt.Errorf("%d of the %d contents the index names look lost (%d packs): more than half of the repository, so nothing is dropped; check the storage's location, credentials and health", len(lost), inv.contents, len(inv.packs))
	}
	if len(lost) > 0 {
		if err := drop(ctx, dr, lost); err != nil {
			return state, err
		}
		state.LostContents = len(lost)
		state.MissingPacks, state.DamagedPacks = lost.packs()
		f := v.found
		if f == nil {
			f = &maintenancestate.IntegrityState{}
		}
		missing, damaged := lost.packs()
		f.LostContents += len(lost)
		f.MissingPacks, f.DamagedPacks = firstPacks(f.MissingPacks, missing), firstPacks(f.DamagedPacks, damaged)
		v.found = f
		if v.pending == nil {
			v.pending = map[content.ID]loss{}
		}
		for _, l := range lost {
			v.pending[l.id] = l
		}
	}
	lostContents.Add(float64(len(lost)))
	// Walking every snapshot costs a read of every directory object: it
	// is done when something is lost now or waits to be forgotten, while
	// something is damaged, and once after the pod starts, which knows
	// nothing of earlier passes.
	var d *damage
	forgot := false
	if len(lost) > 0 || len(v.pending) > 0 || !v.walked || v.last.DamagedSnapshots > 0 {
		var victims map[content.ID]bool
		if d, victims, err = walk(ctx, dr, v.pending, inv.stored); err != nil {
			return state, err
		}
		v.walked = true
		// What Kopia's garbage collection would do at its next run, which
		// cannot run while a snapshot references lost data: a content it
		// deleted that a snapshot references after all is undeleted.
		if err := undelete(ctx, dr, victims); err != nil {
			return state, err
		}
		before := len(v.pending)
		if v.pending, err = forget(ctx, dr, inv.stored, v.pending, v.opts.Clock); err != nil {
			return state, err
		}
		forgot = len(v.pending) < before
		v.track(d)
		settled, err := settle(ctx, dr, d, v.pending, inv.stored, v.overdue)
		if err != nil {
			return state, err
		}
		if len(settled) > 0 {
			_, state.Settled = (&damage{sources: settled}).summary()
			// What remains damaged, with the settled snapshots whole.
			if d, _, err = walk(ctx, dr, v.pending, inv.stored); err != nil {
				return state, err
			}
			v.track(d)
		}
		state.DamagedSnapshots, state.Damaged = d.summary()
	}
	state.Pending = len(v.pending)
	changed, err := syncNotices(ctx, dr, d.healing())
	if err != nil {
		return state, err
	}
	v.refreshDue = v.refreshDue || changed || forgot || len(lost) > 0 || len(state.Settled) > 0
	if v.refreshDue && v.opts.Server != nil {
		// What guests see waits for it, not what the pass found: a
		// failure is tried again at the next pass.
		if err := v.opts.Server.Refresh(ctx); err != nil {
			v.opts.Log.Error(err, "the Kopia server was not refreshed after verification changed the repository; tried again at the next pass")
		} else {
			v.refreshDue = false
		}
	}
	return state, nil
}

// firstPacks is a followed by the packs of b it lacks, at most
// maintenancestate.MaxListedPacks.
func firstPacks(a, b []string) []string {
	for _, p := range b {
		if len(a) >= maintenancestate.MaxListedPacks {
			break
		}
		if !slices.Contains(a, p) {
			a = append(a, p)
		}
	}
	return a
}

// track records when each source of d was first found damaged, and
// forgets the sources that are not any more.
func (v *Verifier) track(d *damage) {
	now := v.opts.Clock.Now()
	damaged := map[snapshot.SourceInfo]bool{}
	if v.since == nil {
		v.since = map[snapshot.SourceInfo]time.Time{}
	}
	for _, s := range d.sources {
		damaged[s.src] = true
		if _, ok := v.since[s.src]; !ok {
			v.since[s.src] = now
		}
	}
	for src := range v.since {
		if !damaged[src] {
			delete(v.since, src)
		}
	}
}

// overdue is whether src has been damaged for longer than SettleAfter.
func (v *Verifier) overdue(src snapshot.SourceInfo) bool {
	since, ok := v.since[src]
	return ok && v.opts.Clock.Since(since) > v.opts.SettleAfter
}

// undelete undeletes the contents Kopia's garbage collection deleted
// that a snapshot references.
func undelete(ctx context.Context, dr repo.DirectRepository, ids map[content.ID]bool) error {
	if len(ids) == 0 {
		return nil
	}
	err := repo.DirectWriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "guestbackup integrity: undelete referenced contents"},
		func(ctx context.Context, w repo.DirectRepositoryWriter) error {
			for id := range ids {
				if err := w.ContentManager().UndeleteContent(ctx, id); err != nil {
					return fmt.Errorf("undelete content %s, which a snapshot references: %w", id, err)
				}
			}
			return nil
		})
	if err != nil {
		return err
	}
	if err := dr.Refresh(ctx); err != nil {
		return fmt.Errorf("refresh the index after undeleting contents: %w", err)
	}
	return nil
}

// drop marks the lost contents deleted in the index: a client that
// writes one again then uploads it, where it would have deduplicated
// against the index entry. What Kopia's maintenance later does with a
// deleted content (drop it from the index, once its pack is gone) loses
// nothing that was not lost.
func drop(ctx context.Context, dr repo.DirectRepository, lost losses) error {
	err := repo.DirectWriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "guestbackup integrity: drop lost contents"},
		func(ctx context.Context, w repo.DirectRepositoryWriter) error {
			for _, l := range lost {
				if err := w.ContentManager().DeleteContent(ctx, l.id); err != nil {
					return fmt.Errorf("drop lost content %s (pack %s) from the index: %w", l.id, l.pack, err)
				}
			}
			return nil
		})
	if err != nil {
		return err
	}
	if err := dr.Refresh(ctx); err != nil {
		return fmt.Errorf("refresh the index after dropping lost contents: %w", err)
	}
	return nil
}
