// Package maintenance runs Kopia's repository maintenance in the server
// pod, as the repository's designated maintenance owner.
//
// Kopia runs maintenance only as the one user@host its maintenance
// parameters name (the owner), so that two clients never garbage-collect
// the same repository at once. A repository created through Kopia's
// library, as init creates it, has no owner: nobody runs maintenance, and
// the data of expired snapshots stays in the storage forever.
//
// guestbackup's owner is a fixed identity per BSLS, Owner: not the pod's
// host name, which changes with every pod. Init connects a second
// configuration as that identity (the Kopia server keeps the pod's own, so
// it never runs maintenance itself) and claims the repository's
// maintenance (Claim); the user-sync container then runs Kopia's own quick
// and full cycles on their schedule (Runner), through
// snapshotmaintenance, with Kopia's safety margins.
package maintenance

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	kopiamaintenance "github.com/kopia/kopia/repo/maintenance"
)

// OwnerUsername is the user part of guestbackup's maintenance owner.
const OwnerUsername = "guestbackup-maintenance"

// Owner is the maintenance owner's user name and host name for a BSLS:
// guestbackup-maintenance@<bsls>.<namespace>. It is the same for every pod
// of the BSLS and in a new cluster attached to the same storage.
func Owner(namespace, bsls string) (username, hostname string) {
	return OwnerUsername, bsls + "." + namespace
}

// OwnerName is Owner as Kopia writes it, user@host.
func OwnerName(namespace, bsls string) string {
	user, host := Owner(namespace, bsls)
	return user + "@" + host
}

// Schedule is how often each of Kopia's maintenance cycles runs.
type Schedule struct {
	Quick, Full time.Duration
}

// DefaultSchedule is Kopia's own: quick hourly, full daily.
func DefaultSchedule() Schedule {
	p := kopiamaintenance.DefaultParams()
	return Schedule{Quick: p.QuickCycle.Interval, Full: p.FullCycle.Interval}
}

// withDefaults is s with Kopia's default for an interval that is not
// positive.
func (s Schedule) withDefaults() Schedule {
	d := DefaultSchedule()
	if s.Quick <= 0 {
		s.Quick = d.Quick
	}
	if s.Full <= 0 {
		s.Full = d.Full
	}
	return s
}

// Action is what Claim does with the repository's maintenance owner.
type Action string

// The actions of Decide.
const (
	// ActionKeep: the owner is already ours; only the schedule is kept.
	ActionKeep Action = "Keep"
	// ActionClaim: no owner, or another guestbackup identity (a BSLS
	// renamed or moved to another namespace over the same storage): ours
	// takes over.
	ActionClaim Action = "Claim"
	// ActionLeave: someone else (an admin's kopia CLI, another product)
	// owns maintenance; guestbackup does not take it from them, and says
	// so (Runner reports it).
	ActionLeave Action = "Leave"
)

// Decide says what to do with the current owner, given ours. Only an
// empty owner or one of guestbackup's identities is taken: taking it from
// someone else would make two schedulers run maintenance, with neither
// knowing of the other.
func Decide(current, ours string) Action {
	switch {
	case current == ours:
		return ActionKeep
	case current == "", strings.HasPrefix(current, OwnerUsername+"@"):
		return ActionClaim
	default:
		return ActionLeave
	}
}

// Claim makes r's maintenance owner r's identity (r is opened from the
// configuration Connect wrote) unless someone else owns it, and sets the
// cycles to schedule when the owner is ours. It returns what it did and
// the owner before.
func Claim(ctx context.Context, r repo.Repository, schedule Schedule) (action Action, previous string, err error) {
	params, err := kopiamaintenance.GetParams(ctx, r)
	if err != nil {
		return "", "", fmt.Errorf("read maintenance parameters: %w", err)
	}
	ours := r.ClientOptions().UsernameAtHost()
	previous = params.Owner
	action = Decide(previous, ours)
	if action == ActionLeave {
		return action, previous, nil
	}
	schedule = schedule.withDefaults()
	want := *params
	want.Owner = ours
	want.QuickCycle = kopiamaintenance.CycleParams{Enabled: true, Interval: schedule.Quick}
	want.FullCycle = kopiamaintenance.CycleParams{Enabled: true, Interval: schedule.Full}
	if want.Owner == params.Owner && want.QuickCycle == params.QuickCycle && want.FullCycle == params.FullCycle {
		return action, previous, nil
	}
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup maintenance owner"},
		func(ctx context.Context, w repo.RepositoryWriter) error {
			return kopiamaintenance.SetParams(ctx, w, &want)
		})
	if err != nil {
		return action, previous, fmt.Errorf("set maintenance owner %s: %w", ours, err)
	}
	return action, previous, nil
}
