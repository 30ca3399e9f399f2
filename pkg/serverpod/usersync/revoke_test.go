package usersync

import (
	"slices"
	"testing"

	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
)

func TestRevocations(t *testing.T) {
	hash := func(b byte) identity.Hash { return identity.Hash{Version: identity.Scrypt, Value: []byte{b}} }
	base := kopiauser.DefaultACLs()
	grant := kopiauser.GrantACL("new@team-a", "old@team-a")
	otherGrant := kopiauser.GrantACL("new@team-a", "gone@team-a")
	access := func(users map[string]identity.Hash, rules ...kopiauser.ACL) Access {
		return Access{Users: users, Rules: slices.Concat(base, rules)}
	}
	forged := kopiauser.ACL{User: "db@team-a", Target: map[string]string{"type": "snapshot"}, Access: kopiauser.AccessFull}
	for _, tt := range []struct {
		name    string
		last    *Access
		now     Access
		changes []kopiauser.Change
		removed []kopiauser.ACL
		want    []Revocation
	}{
		{name: "the first sync, with nothing written: nothing known to revoke",
			now: access(map[string]identity.Hash{"db@team-a": hash(1)})},
		{name: "nothing changed",
			last: new(access(map[string]identity.Hash{"db@team-a": hash(1)}, grant)),
			now:  access(map[string]identity.Hash{"db@team-a": hash(1)}, grant)},
		{name: "a user added, a grant added: access only widened",
			last: new(access(map[string]identity.Hash{"db@team-a": hash(1)})),
			now:  access(map[string]identity.Hash{"db@team-a": hash(1), "new@team-a": hash(2)}, grant)},
		{name: "a user removed (its VM deleted or opted out)",
			last: new(access(map[string]identity.Hash{"db@team-a": hash(1), "old@team-a": hash(2)})),
			now:  access(map[string]identity.Hash{"db@team-a": hash(1)}),
			want: []Revocation{{Users: "old@team-a", Reason: RevokedUserRemoved, Why: "user removed"}}},
		{name: "a password changed (a rotation): sessions opened with the old one end",
			last: new(access(map[string]identity.Hash{"db@team-a": hash(1)})),
			now:  access(map[string]identity.Hash{"db@team-a": hash(9)}),
			want: []Revocation{{Users: "db@team-a", Reason: RevokedPasswordChanged, Why: "password changed"}}},
		{name: "a restore grant revoked: its grantee's sessions end, not the source's",
			last: new(access(map[string]identity.Hash{"new@team-a": hash(1), "old@team-a": hash(2)}, grant)),
			now:  access(map[string]identity.Hash{"new@team-a": hash(1), "old@team-a": hash(2)}),
			want: []Revocation{{Users: "new@team-a", Reason: RevokedRestoreGrant, Why: "restore grant of old@team-a revoked"}}},
		{name: "a grant moved to another source: the old one is revoked",
			last: new(access(map[string]identity.Hash{"new@team-a": hash(1)}, otherGrant)),
			now:  access(map[string]identity.Hash{"new@team-a": hash(1)}, grant),
			want: []Revocation{{Users: "new@team-a", Reason: RevokedRestoreGrant, Why: "restore grant of gone@team-a revoked"}}},
		{name: "another replica wrote the change: known from the access alone",
			last: new(access(map[string]identity.Hash{"new@team-a": hash(1), "old@team-a": hash(2)}, grant)),
			now:  access(map[string]identity.Hash{"new@team-a": hash(1)}),
			want: []Revocation{
				{Users: "new@team-a", Reason: RevokedRestoreGrant, Why: "restore grant of old@team-a revoked"},
				{Users: "old@team-a", Reason: RevokedUserRemoved, Why: "user removed"},
			}},
		{name: "the first sync removed users and a grant the repository held (a new pod, or another writer)",
			now: access(map[string]identity.Hash{"db@team-a": hash(1)}),
			changes: []kopiauser.Change{
				{Op: kopiauser.OpAdd, Username: "new@team-a", Hash: hash(3)},
				{Op: kopiauser.OpDelete, Username: "intruder@team-a"},
				{Op: kopiauser.OpUpdate, Username: "db@team-a", Hash: hash(1)},
			},
			removed: []kopiauser.ACL{grant},
			want: []Revocation{
				{Users: "db@team-a", Reason: RevokedPasswordChanged, Why: "password changed"},
				{Users: "intruder@team-a", Reason: RevokedUserRemoved, Why: "user removed"},
				{Users: "new@team-a", Reason: RevokedRestoreGrant, Why: "restore grant of old@team-a revoked"},
			}},
		{name: "a forged rule removed: the sessions of whom it named end",
			last:    new(access(map[string]identity.Hash{"db@team-a": hash(1)})),
			now:     access(map[string]identity.Hash{"db@team-a": hash(1)}),
			removed: []kopiauser.ACL{forged},
			want:    []Revocation{{Users: "db@team-a", Reason: RevokedAccessRule, Why: "access rule removed: " + forged.String()}}},
		{name: "a rule for everyone removed (the BSLS turned append-only): every session ends",
			last: new(access(nil)),
			now:  Access{Rules: kopiauser.AppendOnlyACLs()},
			want: []Revocation{
				{Users: "*@*", Reason: RevokedAccessRule, Why: "access rule removed: " + base[4].String()},
				{Users: "*@*", Reason: RevokedAccessRule, Why: "access rule removed: " + base[3].String()},
				{Users: "*@*", Reason: RevokedAccessRule, Why: "access rule removed: " + base[5].String()},
			}},
		{name: "a duplicate of a rule still in force removed: nothing revoked",
			last:    new(access(map[string]identity.Hash{"new@team-a": hash(1)}, grant)),
			now:     access(map[string]identity.Hash{"new@team-a": hash(1)}, grant),
			removed: []kopiauser.ACL{grant, base[0]}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := Revocations(tt.last, tt.now, tt.changes, tt.removed)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Revocations:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestRevocationMatches(t *testing.T) {
	for _, tt := range []struct {
		users, user string
		want        bool
	}{
		{"db@team-a", "db@team-a", true},
		{"db@team-a", "db@team-b", false},
		{"db@team-a", "web@team-a", false},
		{"*@team-a", "web@team-a", true},
		{"*@team-a", "web@team-b", false},
		{"db@*", "db@team-b", true},
		{"*@*", "anyone@anywhere", true},
		{"not-a-user", "not-a-user", false},
	} {
		if got := (Revocation{Users: tt.users}).Matches(tt.user); got != tt.want {
			t.Errorf("Revocation{Users: %q}.Matches(%q) = %v, want %v", tt.users, tt.user, got, tt.want)
		}
	}
}
