package kopiauser

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
)

// Kopia keeps access rules as repository manifests of type "acl", like
// users. While a repository has none, its server lets every user do
// anything to its own snapshots; with any, the server (re-reading them
// every 10 seconds) allows exactly what they grant. Kopia's ACL package is
// internal, so the format is written here: the payload is
// {"user","target","access"} with access one of NONE, READ, APPEND, FULL.
const aclManifestType = "acl"

// LabelManagedACL marks the ACL manifests guestbackup writes; an admin's
// own rules (written with `kopia server acl add`) are never touched.
const LabelManagedACL = "guestbackup.io/managed"

// Access levels of an ACL.
const (
	AccessRead   = "READ"
	AccessAppend = "APPEND"
	AccessFull   = "FULL"
)

// Placeholders Kopia replaces with the user and host the rule is applied to.
const (
	ownUser = "OWN_USER"
	ownHost = "OWN_HOST"
)

// ACL grants User (wildcards allowed: "*@*") Access to the manifests whose
// labels match Target.
type ACL struct {
	User   string            `json:"user"`
	Target map[string]string `json:"target"`
	Access string            `json:"access"`
}

// key identifies an ACL by everything it says.
func (a ACL) key() string {
	keys := slices.Sorted(maps.Keys(a.Target))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", a.User, a.Access)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, a.Target[k])
	}
	return b.String()
}

// AppendOnlyACLs are Kopia's default rules with three changes: a guest may
// create and read its own snapshots but not delete them; may read but not
// change its own policies, because the server itself applies a source's
// retention policy after each snapshot, so a guest that could set
// keep-latest=1 could still erase its history; and may read but not change
// its own user profile. Retention is then the admin's (the repository's
// global policy, repository.defaultPolicy).
func AppendOnlyACLs() []ACL {
	const anyone = "*@*"
	return []ACL{
		{User: anyone, Target: map[string]string{manifest.TypeLabelKey: "content"}, Access: AccessAppend},
		{User: anyone, Target: map[string]string{manifest.TypeLabelKey: policy.ManifestType, policy.PolicyTypeLabel: policy.PolicyTypeGlobal}, Access: AccessRead},
		{User: anyone, Target: map[string]string{manifest.TypeLabelKey: policy.ManifestType, policy.PolicyTypeLabel: policy.PolicyTypeHost, policy.HostnameLabel: ownHost}, Access: AccessRead},
		{User: anyone, Target: map[string]string{manifest.TypeLabelKey: policy.ManifestType, policy.UsernameLabel: ownUser, policy.HostnameLabel: ownHost}, Access: AccessRead},
		{User: anyone, Target: map[string]string{manifest.TypeLabelKey: snapshot.ManifestType, snapshot.UsernameLabel: ownUser, snapshot.HostnameLabel: ownHost}, Access: AccessAppend},
		{User: anyone, Target: map[string]string{manifest.TypeLabelKey: manifestType, usernameLabel: ownUser + "@" + ownHost}, Access: AccessRead},
	}
}

// SyncACLs makes guestbackup's ACL manifests exactly desired, by diff, in
// one write session, and reports whether it changed any.
func SyncACLs(ctx context.Context, r repo.Repository, desired []ACL) (bool, error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: aclManifestType, LabelManagedACL: "true"})
	if err != nil {
		return false, fmt.Errorf("list ACLs: %w", err)
	}
	want := map[string]ACL{}
	for _, a := range desired {
		want[a.key()] = a
	}
	var stale []manifest.ID
	for _, e := range entries {
		var a ACL
		if _, err := r.GetManifest(ctx, e.ID, &a); err != nil {
			return false, fmt.Errorf("read ACL %s: %w", e.ID, err)
		}
		if _, ok := want[a.key()]; ok {
			delete(want, a.key()) // present: keep it, and only once
			continue
		}
		stale = append(stale, e.ID)
	}
	if len(want) == 0 && len(stale) == 0 {
		return false, nil
	}
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup ACL sync"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		for _, id := range stale {
			if err := w.DeleteManifest(ctx, id); err != nil {
				return fmt.Errorf("delete ACL %s: %w", id, err)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if _, err := w.PutManifest(ctx, map[string]string{manifest.TypeLabelKey: aclManifestType, LabelManagedACL: "true"}, want[k]); err != nil {
				return fmt.Errorf("write ACL %s: %w", k, err)
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("sync ACLs: %w", err)
	}
	return true, nil
}
