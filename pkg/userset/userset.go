// Package userset is the format of the users Secrets: how the controller
// hands a BSLS's users (names and password hashes, never passwords) to the
// user-sync container of its server pod, and how the VM reconciler tells
// that a user is provisioned.
package userset

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// How the desired users reach a server pod: the controller hashes each VM's
// password once and writes the hashes into "users Secrets" in the BSLS's
// namespace; the pod's user-sync container watches them and applies them to
// the repository by diff. A Secret holds at most 1 MiB, about 8,000 users, so
// users are spread over Shards Secrets by a hash of their name: 10,000
// users make about 80 KiB a shard, and a shard stays under its limit up to
// about 100,000 users (about 75,000 when each also has a quota line).
const (
	// Shards is the number of users Secrets per BSLS.
	Shards = 16
	// Key is the key of a users Secret that holds its users.
	Key = "users"
	// Label marks a users Secret with the name of its BSLS.
	Label = "guestbackup.io/users-of"
)

// SecretName is the name of a BSLS's users Secret for one shard.
func SecretName(bslsName string, shard int) string {
	return fmt.Sprintf("%s-users-%d", bslsName, shard)
}

// ShardOf is the shard a user's hash is kept in.
func ShardOf(username string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(username)) // never fails
	return int(h.Sum32() % Shards)
}

// Encode renders users as the content of a users Secret: one line per
// user, sorted, "<user@host> <hash version> <base64 of salt||key>". Sorted
// output keeps a Secret unchanged when its users are.
func Encode(users map[string]identity.Hash) []byte {
	var b bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(users)) {
		h := users[name]
		fmt.Fprintf(&b, "%s %d %s\n", name, h.Version, base64.StdEncoding.EncodeToString(h.Value))
	}
	return b.Bytes()
}

// Decode parses what Encode wrote, rejecting any malformed line,
// invalid user name or hash, or duplicate user.
func Decode(data []byte) (map[string]identity.Hash, error) {
	users := map[string]identity.Hash{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			return nil, fmt.Errorf("line %d: want \"<user@host> <version> <hash>\", got %d fields", n, len(fields))
		}
		name := fields[0]
		if err := identity.ValidateUsername(name); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		version, err := strconv.Atoi(fields[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: hash version %q: %w", n, fields[1], err)
		}
		value, err := base64.StdEncoding.DecodeString(fields[2])
		if err != nil {
			return nil, fmt.Errorf("line %d: hash of %s: %w", n, name, err)
		}
		h := identity.Hash{Version: identity.HashVersion(version), Value: value}
		if err := h.Validate(); err != nil {
			return nil, fmt.Errorf("line %d: user %s: %w", n, name, err)
		}
		if _, dup := users[name]; dup {
			return nil, fmt.Errorf("line %d: user %s listed twice", n, name)
		}
		users[name] = h
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return users, nil
}

// GrantsKey is the key of a users Secret that holds the restore grants of
// its shard's users (the grantees'): one line per grant, sorted,
// "<grantee> <source>".
const GrantsKey = "grants"

// Grant lets the guest of Grantee read the snapshots of Source, another
// identity of the same namespace (the VM annotation
// guestbackup.io/restore-from): the server pod writes it as a read-only
// Kopia ACL on Source's snapshot manifests, for Grantee alone.
type Grant struct {
	Grantee string
	Source  string
}

// Validate checks that both sides are identities of one namespace, and
// distinct: a grant never crosses namespaces, whoever wrote it.
func (g Grant) Validate() error {
	for _, u := range []string{g.Grantee, g.Source} {
		if err := identity.ValidateUsername(u); err != nil {
			return err
		}
	}
	_, gns, _ := strings.Cut(g.Grantee, "@")
	_, sns, _ := strings.Cut(g.Source, "@")
	if gns != sns {
		return fmt.Errorf("grant of %s to %s crosses namespaces", g.Source, g.Grantee)
	}
	if g.Grantee == g.Source {
		return fmt.Errorf("grant of %s to itself", g.Source)
	}
	return nil
}

// EncodeGrants renders grants as the content of a users Secret's GrantsKey,
// sorted, so that unchanged grants give an unchanged Secret.
func EncodeGrants(grants []Grant) []byte {
	lines := make([]string, 0, len(grants))
	for _, g := range grants {
		lines = append(lines, g.Grantee+" "+g.Source+"\n")
	}
	slices.Sort(lines)
	return []byte(strings.Join(slices.Compact(lines), ""))
}

// DecodeGrants parses what EncodeGrants wrote, rejecting any malformed
// line or invalid grant.
func DecodeGrants(data []byte) ([]Grant, error) {
	var grants []Grant
	err := eachLine(data, "grants line", "<grantee> <source>", 2, func(fields []string) error {
		g := Grant{Grantee: fields[0], Source: fields[1]}
		if err := g.Validate(); err != nil {
			return err
		}
		grants = append(grants, g)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return grants, nil
}

// eachLine calls fn with the fields of each non-empty line of data, which
// must have n, wanting the format want; an error names the line, after
// what ("grants line 3: ...").
func eachLine(data []byte, what, want string, n int, fn func(fields []string) error) error {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		if sc.Text() == "" {
			continue
		}
		fields := strings.Fields(sc.Text())
		if len(fields) != n {
			return fmt.Errorf("%s %d: want %q, got %d fields", what, line, want, len(fields))
		}
		if err := fn(fields); err != nil {
			return fmt.Errorf("%s %d: %w", what, line, err)
		}
	}
	return sc.Err()
}

// QuotasKey is the key of a users Secret that holds the quotas of its
// shard's users: one line per user with a quota, sorted,
// "<user@host> <bytes>". A user it does not list has no quota.
const QuotasKey = "quotas"

// EncodeQuotas renders quotas (bytes by user) as the content of a users
// Secret's QuotasKey, sorted, so that unchanged quotas give an unchanged
// Secret.
func EncodeQuotas(quotas map[string]int64) []byte {
	var b bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(quotas)) {
		fmt.Fprintf(&b, "%s %d\n", name, quotas[name])
	}
	return b.Bytes()
}

// DecodeQuotas parses what EncodeQuotas wrote, rejecting any malformed
// line, invalid user name, negative quota or duplicate user.
func DecodeQuotas(data []byte) (map[string]int64, error) {
	quotas := map[string]int64{}
	err := eachLine(data, "quotas line", "<user@host> <bytes>", 2, func(fields []string) error {
		if err := identity.ValidateUsername(fields[0]); err != nil {
			return err
		}
		quota, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil || quota < 0 {
			return fmt.Errorf("quota of %s: want a number of bytes, got %q", fields[0], fields[1])
		}
		if _, dup := quotas[fields[0]]; dup {
			return fmt.Errorf("user %s listed twice", fields[0])
		}
		quotas[fields[0]] = quota
		return nil
	})
	if err != nil {
		return nil, err
	}
	return quotas, nil
}

// RestoreFrom reads the restore grant VirtualMachine vm of namespace asks
// for with its annotations (guestbackup.io/restore-from): the name of
// another VM of its own namespace, which may be deleted, whose identity's
// snapshots vm's guest may then read. The value is a name and nothing else,
// so a grant never leaves the namespace: "<namespace>/<vm>" or
// "<vm>@<namespace>" is refused. It returns nil and "" when vm asks for no
// grant, and nil and why, in words its owner can act on, when its value
// grants nothing. The controller provisions grants by this rule, and the
// webhook admits a GuestRestore from another VM by it: one rule, so that
// a request is never more permissive than the guest's own rights.
func RestoreFrom(vm, namespace string, annotations map[string]string) (*Grant, string) {
	value, ok := annotations[v1alpha1.AnnotationRestoreFrom]
	if !ok {
		return nil, ""
	}
	refuse := func(why string) string {
		return fmt.Sprintf("annotation %s=%q grants nothing: %s; name a VirtualMachine of namespace %s (it may be deleted) whose snapshots this VM's guest may read",
			v1alpha1.AnnotationRestoreFrom, value, why, namespace)
	}
	if errs := validation.IsDNS1123Subdomain(value); len(errs) > 0 {
		why := "it is not a VirtualMachine name (" + strings.Join(errs, "; ") + ")"
		if strings.ContainsAny(value, "/@") {
			why = "a VM of another namespace can never be named"
		}
		return nil, refuse(why)
	}
	g := Grant{Grantee: identity.OfVM(vm, namespace), Source: identity.OfVM(value, namespace)}
	if g.Source == g.Grantee {
		return nil, refuse("it names this VM itself, whose snapshots its guest reads anyway")
	}
	if err := g.Validate(); err != nil {
		return nil, refuse(err.Error())
	}
	return &g, ""
}
