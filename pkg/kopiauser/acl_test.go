package kopiauser

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// level is Kopia's effective access of user@host to a manifest labelled
// labels under rules (internal/acl.EffectivePermissions of v0.23.1: the
// highest access of the rules whose user and every target label match,
// OWN_USER and OWN_HOST replaced): 0 is NONE.
func level(rules []ACL, user, host string, labels map[string]string) int {
	rank := map[string]int{AccessRead: 1, AccessAppend: 2, AccessFull: 3}
	best := 0
	for _, r := range rules {
		ru, rh, _ := strings.Cut(r.User, "@")
		if (ru != "*" && ru != user) || (rh != "*" && rh != host) {
			continue
		}
		match := true
		for k, v := range r.Target {
			v = strings.ReplaceAll(strings.ReplaceAll(v, ownUser, user), ownHost, host)
			if labels[k] != v {
				match = false
			}
		}
		if match {
			best = max(best, rank[r.Access])
		}
	}
	return best
}

func TestACLSetsGrant(t *testing.T) {
	const none, read, appendOnly, full = 0, 1, 2, 3
	// The guest is VM db in namespace team-a; the victim is web in team-b.
	labels := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		name               string
		labels             map[string]string
		normal, appendOnly int
	}{
		{"contents", labels("type", "content"), appendOnly, appendOnly},
		{"own snapshot", labels("type", "snapshot", "username", "db", "hostname", "team-a", "path", "/data"), full, appendOnly},
		{"another VM's snapshot", labels("type", "snapshot", "username", "web", "hostname", "team-b", "path", "/data"), none, none},
		{"a snapshot of another VM of its namespace", labels("type", "snapshot", "username", "web", "hostname", "team-a", "path", "/data"), none, none},
		{"own path policy", labels("type", "policy", "policyType", "path", "username", "db", "hostname", "team-a", "path", "/data"), full, read},
		{"own user policy", labels("type", "policy", "policyType", "user", "username", "db", "hostname", "team-a"), full, read},
		{"the global policy", labels("type", "policy", "policyType", "global"), read, read},
		{"a global policy labelled with its own user and host", labels("type", "policy", "policyType", "global", "username", "db", "hostname", "team-a"), read, read},
		{"a host policy labelled with its own user", labels("type", "policy", "policyType", "host", "username", "db", "hostname", "team-a"), read, read},
		{"another namespace's host policy", labels("type", "policy", "policyType", "host", "hostname", "team-b"), none, none},
		{"another VM's path policy", labels("type", "policy", "policyType", "path", "username", "web", "hostname", "team-b", "path", "/data"), none, none},
		{"own user profile (its password)", labels("type", "user", "username", "db@team-a"), read, read},
		{"another user's profile", labels("type", "user", "username", "web@team-b"), none, none},
		{"an ACL", labels("type", "acl"), none, none},
		{"an ACL labelled with its own user and host", labels("type", "acl", "username", "db", "hostname", "team-a"), none, none},
		{"an ACL labelled as guestbackup's", labels("type", "acl", LabelManagedACL, "true", "username", "db", "hostname", "team-a"), none, none},
		{"a manifest of an unknown type with its own labels", labels("type", "maintenance", "username", "db", "hostname", "team-a"), none, none},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := level(DefaultACLs(), "db", "team-a", c.labels); got != c.normal {
				t.Errorf("default mode: access %d, want %d", got, c.normal)
			}
			if got := level(AppendOnlyACLs(), "db", "team-a", c.labels); got != c.appendOnly {
				t.Errorf("append-only mode: access %d, want %d", got, c.appendOnly)
			}
		})
	}
}

func TestACLsFor(t *testing.T) {
	if !slices.EqualFunc(ACLsFor(false), DefaultACLs(), func(a, b ACL) bool { return a.key() == b.key() }) {
		t.Error("ACLsFor(false) is not DefaultACLs")
	}
	if !slices.EqualFunc(ACLsFor(true), AppendOnlyACLs(), func(a, b ACL) bool { return a.key() == b.key() }) {
		t.Error("ACLsFor(true) is not AppendOnlyACLs")
	}
}

func TestPlanACLs(t *testing.T) {
	desired := AppendOnlyACLs()[:2]
	managed := managedLabels()
	entry := func(id string, labels map[string]string, a ACL) aclEntry {
		return aclEntry{meta: &manifest.EntryMetadata{ID: manifest.ID(id), Labels: labels}, acl: a}
	}
	forged := ACL{User: "db@team-a", Target: map[string]string{manifest.TypeLabelKey: "snapshot"}, Access: AccessFull}
	guestLabels := map[string]string{manifest.TypeLabelKey: aclManifestType, "username": "db", "hostname": "team-a"}
	cases := []struct {
		name                  string
		found                 []aclEntry
		wantDelete, wantAlien []string
		wantWrite             int
		// wantRemoved are the rules of deleted manifests that no desired
		// ACL grants: access the server enforced until then.
		wantRemoved []ACL
	}{
		{name: "an empty repository gets every desired ACL", wantWrite: 2},
		{name: "in step", found: []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1])}},
		{name: "a forged FULL grant is deleted and reported",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), entry("x", guestLabels, forged)},
			wantDelete: []string{"x"}, wantAlien: []string{"x"}, wantRemoved: []ACL{forged}},
		{name: "a forgery carrying guestbackup's label is foreign all the same",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), entry("x", managed, forged)},
			wantDelete: []string{"x"}, wantAlien: []string{"x"}, wantRemoved: []ACL{forged}},
		{name: "a desired grant without guestbackup's exact labels is replaced",
			found:      []aclEntry{entry("a", guestLabels, desired[0]), entry("b", managed, desired[1])},
			wantDelete: []string{"a"}, wantAlien: []string{"a"}, wantWrite: 1},
		{name: "an admin's own rule is foreign too",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), entry("adm", map[string]string{manifest.TypeLabelKey: aclManifestType}, ACL{User: "auditor@ops", Target: map[string]string{manifest.TypeLabelKey: "snapshot"}, Access: AccessRead})},
			wantDelete: []string{"adm"}, wantAlien: []string{"adm"}, wantRemoved: []ACL{{User: "auditor@ops", Target: map[string]string{manifest.TypeLabelKey: "snapshot"}, Access: AccessRead}}},
		{name: "a payload that is no ACL is foreign",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), {meta: &manifest.EntryMetadata{ID: "junk", Labels: managed}, raw: `{"user":"*@*","access":"FULL","extra":1}`}},
			wantDelete: []string{"junk"}, wantAlien: []string{"junk"}},
		{name: "guestbackup's own duplicate is deleted quietly",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("a2", managed, desired[0]), entry("b", managed, desired[1])},
			wantDelete: []string{"a2"}},
		{name: "the other mode's rule is deleted quietly when the BSLS changes mode",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), entry("old", managed, DefaultACLs()[5])},
			wantDelete: []string{"old"}, wantRemoved: []ACL{DefaultACLs()[5]}},
		{name: "a revoked restore grant is deleted quietly",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), entry("g", managed, GrantACL("web@team-a", "old@team-a"))},
			wantDelete: []string{"g"}, wantRemoved: []ACL{GrantACL("web@team-a", "old@team-a")}},
		{name: "a grant-shaped rule across namespaces is foreign",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), entry("x", managed, GrantACL("spy@team-b", "old@team-a"))},
			wantDelete: []string{"x"}, wantAlien: []string{"x"}, wantRemoved: []ACL{GrantACL("spy@team-b", "old@team-a")}},
		{name: "a grant-shaped rule for anyone is foreign",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), entry("x", managed, GrantACL("*@team-a", "old@team-a"))},
			wantDelete: []string{"x"}, wantAlien: []string{"x"}, wantRemoved: []ACL{GrantACL("*@team-a", "old@team-a")}},
		{name: "a grant-shaped rule with more than READ is foreign",
			found: []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]),
				entry("x", managed, ACL{User: "web@team-a", Target: GrantACL("web@team-a", "old@team-a").Target, Access: AccessFull})},
			wantDelete: []string{"x"}, wantAlien: []string{"x"}, wantRemoved: []ACL{{User: "web@team-a", Target: GrantACL("web@team-a", "old@team-a").Target, Access: AccessFull}}},
		{name: "the other mode's rule without guestbackup's exact labels is foreign",
			found:      []aclEntry{entry("a", managed, desired[0]), entry("b", managed, desired[1]), entry("x", guestLabels, DefaultACLs()[5])},
			wantDelete: []string{"x"}, wantAlien: []string{"x"}, wantRemoved: []ACL{DefaultACLs()[5]}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			del, foreign, write, removed := planACLs(c.found, desired)
			ids := make([]string, len(del))
			for i, id := range del {
				ids[i] = string(id)
			}
			aliens := make([]string, len(foreign))
			for i, f := range foreign {
				aliens[i] = string(f.ID)
			}
			if !slices.Equal(ids, c.wantDelete) || !slices.Equal(aliens, c.wantAlien) || len(write) != c.wantWrite {
				t.Errorf("delete %v, foreign %v, write %d; want delete %v, foreign %v, write %d", ids, aliens, len(write), c.wantDelete, c.wantAlien, c.wantWrite)
			}
			if !slices.EqualFunc(removed, c.wantRemoved, func(a, b ACL) bool { return a.key() == b.key() }) {
				t.Errorf("removed %v, want %v", removed, c.wantRemoved)
			}
		})
	}
}

// acls returns every ACL manifest in the repository, keyed, and whether
// it carries guestbackup's labels.
func acls(t *testing.T, r repo.Repository) map[string]bool {
	t.Helper()
	entries, err := r.FindManifests(context.Background(), map[string]string{manifest.TypeLabelKey: aclManifestType})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		var a ACL
		if _, err := r.GetManifest(context.Background(), e.ID, &a); err != nil {
			t.Fatal(err)
		}
		out[a.key()] = isManaged(e.Labels)
	}
	return out
}

func TestSyncACLs(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewRepository(t)
	// What the attack left: a guest's self-granted FULL, labelled with its
	// own user and host as Kopia's legacy rules let it write.
	forged := ACL{User: "db@team-a", Target: map[string]string{manifest.TypeLabelKey: "snapshot"}, Access: AccessFull}
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
		_, err := w.PutManifest(ctx, map[string]string{manifest.TypeLabelKey: aclManifestType, "username": "db", "hostname": "team-a"}, forged)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	res, err := SyncACLs(ctx, r, DefaultACLs())
	if err != nil || !res.Changed {
		t.Fatalf("first sync: %+v, error %v", res, err)
	}
	if len(res.Foreign) != 1 || res.Foreign[0].ACL.key() != forged.key() || !strings.Contains(res.Foreign[0].String(), "db@team-a FULL type=snapshot") {
		t.Errorf("the forged ACL is not reported: %+v", res.Foreign)
	}
	got := acls(t, r)
	if len(got) != len(DefaultACLs()) {
		t.Fatalf("after the first sync, want exactly the default set: %v", got)
	}
	for _, a := range DefaultACLs() {
		if !got[a.key()] {
			t.Errorf("missing managed ACL %s", a.key())
		}
	}

	if res, err := SyncACLs(ctx, r, DefaultACLs()); err != nil || res.Changed || len(res.Foreign) != 0 {
		t.Errorf("a resync in step: %+v, error %v; want nothing to do", res, err)
	}

	res, err = SyncACLs(ctx, r, AppendOnlyACLs())
	if err != nil || !res.Changed || len(res.Foreign) != 0 {
		t.Fatalf("turning append-only on: %+v, error %v", res, err)
	}
	got = acls(t, r)
	if len(got) != len(AppendOnlyACLs()) {
		t.Errorf("after turning append-only on, want exactly the append-only set: %v", got)
	}
	for _, a := range AppendOnlyACLs() {
		if !got[a.key()] {
			t.Errorf("missing managed ACL %s", a.key())
		}
	}
}
