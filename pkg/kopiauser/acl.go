package kopiauser

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"

	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/rehash"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// Kopia keeps access rules as repository manifests of type "acl", like
// users. While a repository has none, its server applies legacy rules under
// which a user may write ANY manifest labelled with its own username and
// hostname, including manifests of type "acl": a guest could grant itself
// FULL access to everything. guestbackup therefore always keeps an explicit
// set (DefaultACLs or AppendOnlyACLs), and nothing else: the server then
// allows exactly what they grant, re-reading them every 10 seconds and on
// every control-API refresh. Kopia's ACL package is internal, so the format
// is written here: the payload is {"user","target","access"} with access
// one of NONE, READ, APPEND, FULL.
const aclManifestType = "acl"

// LabelManagedACL marks the ACL manifests guestbackup writes. Any other ACL
// manifest (one a guest forged, or an admin added with `kopia server acl
// add`) is removed by SyncACLs and reported.
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

// String is the ACL as a log line or an Event shows it.
func (a ACL) String() string { return a.key() }

const anyone = "*@*"

// Targets shared by both sets. A rule matches a manifest when every label
// it names has its value, so rules on policies name the policy type: a rule
// on "username=OWN_USER, hostname=OWN_HOST" alone would also match a
// manifest a guest labels policyType=global, and Kopia would take it for
// the global policy of every guest.
var (
	contentTarget   = map[string]string{manifest.TypeLabelKey: "content"}
	globalPolicy    = map[string]string{manifest.TypeLabelKey: policy.ManifestType, policy.PolicyTypeLabel: policy.PolicyTypeGlobal}
	hostPolicy      = map[string]string{manifest.TypeLabelKey: policy.ManifestType, policy.PolicyTypeLabel: policy.PolicyTypeHost, policy.HostnameLabel: ownHost}
	ownUserPolicy   = map[string]string{manifest.TypeLabelKey: policy.ManifestType, policy.PolicyTypeLabel: policy.PolicyTypeUser, policy.UsernameLabel: ownUser, policy.HostnameLabel: ownHost}
	ownPathPolicies = map[string]string{manifest.TypeLabelKey: policy.ManifestType, policy.PolicyTypeLabel: policy.PolicyTypePath, policy.UsernameLabel: ownUser, policy.HostnameLabel: ownHost}
	ownSnapshots    = map[string]string{manifest.TypeLabelKey: snapshot.ManifestType, snapshot.UsernameLabel: ownUser, snapshot.HostnameLabel: ownHost}
	ownUserProfile  = map[string]string{manifest.TypeLabelKey: identity.ManifestType, identity.LabelUsername: ownUser + "@" + ownHost}
	ownRehash       = map[string]string{manifest.TypeLabelKey: rehash.ManifestType, rehash.LabelUsername: ownUser, rehash.LabelHostname: ownHost}
)

// DefaultACLs are the rules of a BSLS that is not append-only: Kopia's own
// defaults, narrowed. A guest has FULL access to its own snapshots and to
// its own user and path policies (so its client applies and changes its
// retention, as Kopia's clients do), APPEND to contents, READ on the
// global policy, its host's policy, its own user profile and its own
// rehash notice (package rehash). It can write no ACL, no other policy
// type, no notice, and nothing of another user; its password is the
// controller's to set.
func DefaultACLs() []ACL {
	return []ACL{
		{User: anyone, Target: contentTarget, Access: AccessAppend},
		{User: anyone, Target: globalPolicy, Access: AccessRead},
		{User: anyone, Target: hostPolicy, Access: AccessRead},
		{User: anyone, Target: ownUserPolicy, Access: AccessFull},
		{User: anyone, Target: ownPathPolicies, Access: AccessFull},
		{User: anyone, Target: ownSnapshots, Access: AccessFull},
		{User: anyone, Target: ownUserProfile, Access: AccessRead},
		{User: anyone, Target: ownRehash, Access: AccessRead},
	}
}

// AppendOnlyACLs are DefaultACLs with guests' writes reduced to adding: a
// guest may create and read its own snapshots but not delete them, and
// may read but not change its own policies, because the server applies a
// source's retention policy after each snapshot on the client's request.
// Even so, that retention must delete nothing: see package retention.
func AppendOnlyACLs() []ACL {
	return []ACL{
		{User: anyone, Target: contentTarget, Access: AccessAppend},
		{User: anyone, Target: globalPolicy, Access: AccessRead},
		{User: anyone, Target: hostPolicy, Access: AccessRead},
		{User: anyone, Target: ownUserPolicy, Access: AccessRead},
		{User: anyone, Target: ownPathPolicies, Access: AccessRead},
		{User: anyone, Target: ownSnapshots, Access: AccessAppend},
		{User: anyone, Target: ownUserProfile, Access: AccessRead},
		{User: anyone, Target: ownRehash, Access: AccessRead},
	}
}

// ACLsFor returns the rules of a BSLS.
func ACLsFor(appendOnly bool) []ACL {
	if appendOnly {
		return AppendOnlyACLs()
	}
	return DefaultACLs()
}

// GrantACL is the rule of a restore grant (userset.Grant): its grantee, and
// no one else, may READ the snapshot manifests of the source identity, and
// so list and restore them (contents are readable by every guest already,
// for deduplication, but only by an ID found in a manifest). READ lets it
// neither write, delete nor change a manifest of the source, nor anything
// else.
func GrantACL(grantee, source string) ACL {
	user, host, _ := strings.Cut(source, "@")
	return ACL{User: grantee, Target: map[string]string{manifest.TypeLabelKey: snapshot.ManifestType, snapshot.UsernameLabel: user, snapshot.HostnameLabel: host}, Access: AccessRead}
}

// GrantOf returns the restore grant a is the rule of, when it is one
// GrantACL writes for a valid grant (two identities of one namespace).
func GrantOf(a ACL) (userset.Grant, bool) {
	g := userset.Grant{Grantee: a.User, Source: a.Target[snapshot.UsernameLabel] + "@" + a.Target[snapshot.HostnameLabel]}
	ok := a.Access == AccessRead && maps.Equal(GrantACL(g.Grantee, g.Source).Target, a.Target) && g.Validate() == nil
	return g, ok
}

// isGrant reports whether a is the rule of a valid restore grant.
func isGrant(a ACL) bool {
	_, ok := GrantOf(a)
	return ok
}

// ForeignACL is an ACL manifest guestbackup did not write, found and
// removed by SyncACLs.
type ForeignACL struct {
	ID      manifest.ID       `json:"id"`
	Labels  map[string]string `json:"labels"`
	ModTime time.Time         `json:"modTime"`
	// ACL is what the manifest granted; Raw is its payload when it is not
	// an ACL at all.
	ACL ACL    `json:"acl"`
	Raw string `json:"raw,omitempty"`
}

// String describes the manifest for a log line or an Event: what it
// granted and when it was written, never anything secret (ACLs hold none).
func (f ForeignACL) String() string {
	what := f.ACL.String()
	if f.Raw != "" {
		what = "unreadable payload " + strconv.Quote(truncate(f.Raw, 120))
	}
	return fmt.Sprintf("%s (manifest %s, labels %v, written %s)", what, f.ID, f.Labels, f.ModTime.UTC().Format(time.RFC3339))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// aclEntry is one ACL manifest as found in the repository.
type aclEntry struct {
	meta *manifest.EntryMetadata
	acl  ACL
	raw  string // set when the payload is not an ACL
}

// isManaged reports whether labels are exactly the ones SyncACLs writes.
func isManaged(labels map[string]string) bool {
	return maps.Equal(labels, managedLabels())
}

func managedLabels() map[string]string {
	return map[string]string{manifest.TypeLabelKey: aclManifestType, LabelManagedACL: "true"}
}

// planACLs decides, from the ACL manifests found, which to delete and which
// desired ACLs to write. A manifest is kept only when it carries exactly
// guestbackup's labels and grants exactly one desired ACL not already kept;
// every other one is deleted, and reported as foreign unless it is one of
// guestbackup's own rules with guestbackup's labels. removed are the rules
// of the deleted manifests that no desired ACL grants any more.
func planACLs(found []aclEntry, desired []ACL) (del []manifest.ID, foreign []ForeignACL, write, removed []ACL) {
	want := map[string]ACL{}
	for _, a := range desired {
		want[a.key()] = a
	}
	ours := map[string]bool{}
	for _, a := range slices.Concat(DefaultACLs(), AppendOnlyACLs()) {
		ours[a.key()] = true
	}
	kept := map[string]bool{}
	for _, e := range found {
		k := e.acl.key()
		_, wanted := want[k]
		switch {
		case e.raw == "" && isManaged(e.meta.Labels) && wanted && !kept[k]:
			kept[k] = true
			continue
		case e.raw == "" && isManaged(e.meta.Labels) && (ours[k] || isGrant(e.acl)):
			// Our own: a duplicate (two pods synced at once during a
			// rollout), the other mode's rule (the BSLS changed mode), or a
			// restore grant revoked.
		default:
			foreign = append(foreign, ForeignACL{ID: e.meta.ID, Labels: maps.Clone(e.meta.Labels), ModTime: e.meta.ModTime, ACL: e.acl, Raw: e.raw})
		}
		del = append(del, e.meta.ID)
		if _, granted := want[k]; e.raw == "" && !granted {
			removed = append(removed, e.acl)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if !kept[k] {
			write = append(write, want[k])
		}
	}
	return del, foreign, write, removed
}

// ACLSync is what SyncACLs did.
type ACLSync struct {
	// Changed is whether any ACL manifest was written or deleted: the
	// server must then refresh to apply them at once.
	Changed bool
	// Foreign are the ACL manifests guestbackup did not write, now deleted.
	Foreign []ForeignACL
	// Removed are the rules of the deleted manifests (guestbackup's or
	// not) that no desired ACL grants: access the server enforced until
	// it reloads the repository, and that sessions opened under it keep.
	// A manifest whose payload is no ACL granted nothing, and is not in
	// it.
	Removed []ACL
}

// SyncACLs makes the repository's ACL manifests exactly desired, in one
// write session: it writes the missing ones and deletes every other ACL
// manifest, whoever wrote it, reporting those it did not write.
func SyncACLs(ctx context.Context, r repo.Repository, desired []ACL) (ACLSync, error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: aclManifestType})
	if err != nil {
		return ACLSync{}, fmt.Errorf("list ACLs: %w", err)
	}
	found := make([]aclEntry, 0, len(entries))
	for _, e := range entries {
		var raw json.RawMessage
		if _, err := r.GetManifest(ctx, e.ID, &raw); err != nil {
			return ACLSync{}, fmt.Errorf("read ACL %s: %w", e.ID, err)
		}
		entry := aclEntry{meta: e}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&entry.acl); err != nil {
			entry.raw = string(raw)
		}
		found = append(found, entry)
	}
	del, foreign, write, removed := planACLs(found, desired)
	if len(del) == 0 && len(write) == 0 {
		return ACLSync{}, nil
	}
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup ACL sync"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		// Write first: a repository never passes through zero ACLs, where
		// the server's legacy rules would apply.
		for _, a := range write {
			if _, err := w.PutManifest(ctx, managedLabels(), a); err != nil {
				return fmt.Errorf("write ACL %s: %w", a.key(), err)
			}
		}
		for _, id := range del {
			if err := w.DeleteManifest(ctx, id); err != nil {
				return fmt.Errorf("delete ACL %s: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		return ACLSync{}, fmt.Errorf("sync ACLs: %w", err)
	}
	return ACLSync{Changed: true, Foreign: foreign, Removed: removed}, nil
}
