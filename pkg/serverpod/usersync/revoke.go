package usersync

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
)

// Reasons a user's open sessions are ended: the label of
// SessionsEnded and the words of the Event.
const (
	// RevokedUserRemoved: the user is no longer the BSLS's (its VM was
	// deleted, opted out or moved to another server), or was written
	// into the repository by someone else.
	RevokedUserRemoved = "UserRemoved"
	// RevokedPasswordChanged: the user's password hash changed (a
	// rotation), so the password its sessions were opened with no
	// longer opens one.
	RevokedPasswordChanged = "PasswordChanged"
	// RevokedRestoreGrant: a restore grant the user held was revoked.
	RevokedRestoreGrant = "RestoreGrantRevoked"
	// RevokedAccessRule: an access rule that applied to the user was
	// removed (one guestbackup did not write, or one it no longer wants).
	RevokedAccessRule = "AccessRuleRemoved"
	// RevokedBeforeFirstSync: the session opened before this pod's user
	// sync first applied the users, under whatever the repository held.
	RevokedBeforeFirstSync = "OpenedBeforeFirstSync"
)

// ReasonSessionsEnded is the reason of the Event on the BSLS when user
// sync ended sessions guests held open under access it revoked.
const ReasonSessionsEnded = "SessionsEnded"

// SessionsEnded counts the Kopia sessions user sync ended because the
// access they were opened under was revoked
// (guestbackup_server_sessions_ended_total{reason}).
var SessionsEnded = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "guestbackup_server_sessions_ended_total",
	Help: "Kopia sessions guests held open that user sync ended because the access they were opened under was revoked, by reason.",
}, []string{"reason"})

// Access is what a Kopia server enforces for guests: each user's password
// hash, and the access rules (guestbackup's own and the restore grants).
type Access struct {
	Users map[string]identity.Hash
	Rules []kopiauser.ACL
}

// equal is whether a and b give exactly the same access.
func (a *Access) equal(b *Access) bool {
	if a == nil || b == nil {
		return a == b
	}
	return maps.EqualFunc(a.Users, b.Users, identity.Hash.Equal) && slices.Equal(ruleKeys(a.Rules), ruleKeys(b.Rules))
}

func ruleKeys(rules []kopiauser.ACL) []string {
	keys := make([]string, len(rules))
	for i, r := range rules {
		keys[i] = r.String()
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// Revocation is access a sync took away: the open sessions of the users it
// names must end, since Kopia authorized them once, when they opened.
type Revocation struct {
	// Users is whom it concerns, as a Kopia ACL names users: an identity
	// (user@host), or with "*" for any user or host ("*@*").
	Users string
	// Reason is one of the Revoked* constants; Why says what was revoked.
	Reason, Why string
}

// Matches is whether the revocation concerns user (user@host), by Kopia's
// rule for an ACL's user (internal/acl's userMatches in Kopia v0.23.1).
func (r Revocation) Matches(user string) bool {
	ru, rh, ok := strings.Cut(r.Users, "@")
	u, h, _ := strings.Cut(user, "@")
	return ok && (ru == "*" || ru == u) && (rh == "*" || rh == h)
}

// Revocations returns the access a sync took away, whose open sessions must
// end. last is the access the previous sync left in force (nil before the
// first); now is what this sync left in force. changes are the users it
// wrote into the repository and removed the access rules it deleted there:
// they also were in force, whoever wrote them (another replica, another
// holder of the repository password), since the server had loaded them.
func Revocations(last *Access, now Access, changes []kopiauser.Change, removed []kopiauser.ACL) []Revocation {
	var out []Revocation
	add := func(r Revocation) {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for _, c := range changes {
		switch c.Op {
		case kopiauser.OpDelete:
			add(Revocation{Users: c.Username, Reason: RevokedUserRemoved, Why: "user removed"})
		case kopiauser.OpUpdate:
			add(Revocation{Users: c.Username, Reason: RevokedPasswordChanged, Why: "password changed"})
		}
	}
	var rules []kopiauser.ACL
	if last != nil {
		for user, h := range last.Users {
			switch have, ok := now.Users[user]; {
			case !ok:
				add(Revocation{Users: user, Reason: RevokedUserRemoved, Why: "user removed"})
			case !have.Equal(h):
				add(Revocation{Users: user, Reason: RevokedPasswordChanged, Why: "password changed"})
			}
		}
		rules = last.Rules
	}
	kept := map[string]bool{}
	for _, k := range ruleKeys(now.Rules) {
		kept[k] = true
	}
	for _, a := range slices.Concat(rules, removed) {
		if kept[a.String()] {
			continue
		}
		if g, ok := kopiauser.GrantOf(a); ok {
			add(Revocation{Users: g.Grantee, Reason: RevokedRestoreGrant, Why: "restore grant of " + g.Source + " revoked"})
			continue
		}
		add(Revocation{Users: a.User, Reason: RevokedAccessRule, Why: "access rule removed: " + a.String()})
	}
	slices.SortFunc(out, func(a, b Revocation) int {
		return strings.Compare(a.Users+" "+a.Reason+" "+a.Why, b.Users+" "+b.Reason+" "+b.Why)
	})
	return out
}

// Sessions ends the sessions guests hold open with the Kopia server
// (sessiongate.Gate).
type Sessions interface {
	// End ends the open sessions of every user match accepts, and returns
	// how many it ended of each.
	End(match func(user string) bool) map[string]int
}

// endSessions ends the open sessions of the users revs concern, and tells
// the admin about those it ended: a log line each, SessionsEnded, and one
// Event on the BSLS. The server must already enforce the new access, so
// that the clients reconnect under it.
func (s *Syncer) endSessions(revs []Revocation) {
	if s.opts.Sessions == nil || len(revs) == 0 {
		return
	}
	var what []string
	total := 0
	for _, r := range revs {
		ended := s.opts.Sessions.End(r.Matches)
		for _, user := range slices.Sorted(maps.Keys(ended)) {
			n := ended[user]
			if n == 0 {
				continue
			}
			total += n
			SessionsEnded.WithLabelValues(r.Reason).Add(float64(n))
			s.opts.Log.Info("ended open sessions whose access was revoked", "user", user, "sessions", n, "reason", r.Reason, "why", r.Why)
			what = append(what, fmt.Sprintf("%s: %d (%s)", user, n, r.Why))
		}
	}
	if total == 0 {
		return
	}
	s.event(corev1.EventTypeNormal, ReasonSessionsEnded,
		"Ended %d open Kopia session(s) whose access was revoked; their guests reconnect under the access in force: %s",
		total, strings.Join(what, "; "))
}
