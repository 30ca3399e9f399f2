package kopiaserver

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
)

// How the desired users reach a server pod: the controller hashes each VM's
// password once and writes the hashes into "users Secrets" in the BSLS's
// namespace; the pod's user-sync container watches them and applies them to
// the repository by diff. A Secret holds at most 1 MiB, about 8,000 users, so
// users are spread over UserShards Secrets by a hash of their name: 10,000
// users make about 80 KiB a shard, and a shard stays under its limit up to
// about 100,000 users.
const (
	// UserShards is the number of users Secrets per BSLS.
	UserShards = 16
	// UsersKey is the key of a users Secret that holds its users.
	UsersKey = "users"
	// LabelUsersOf marks a users Secret with the name of its BSLS.
	LabelUsersOf = "guestbackup.io/users-of"
)

// UsersSecretName is the name of a BSLS's users Secret for one shard.
func UsersSecretName(bslsName string, shard int) string {
	return fmt.Sprintf("%s-users-%d", bslsName, shard)
}

// ShardOf is the shard a user's hash is kept in.
func ShardOf(username string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(username)) // never fails
	return int(h.Sum32() % UserShards)
}

// EncodeUsers renders users as the content of a users Secret: one line per
// user, sorted, "<user@host> <hash version> <base64 of salt||key>". Sorted
// output keeps a Secret unchanged when its users are.
func EncodeUsers(users map[string]kopiauser.Hash) []byte {
	names := make([]string, 0, len(users))
	for name := range users {
		names = append(names, name)
	}
	slices.Sort(names)
	var b bytes.Buffer
	for _, name := range names {
		h := users[name]
		fmt.Fprintf(&b, "%s %d %s\n", name, h.Version, base64.StdEncoding.EncodeToString(h.Value))
	}
	return b.Bytes()
}

// DecodeUsers parses what EncodeUsers wrote, rejecting any malformed line,
// invalid user name or hash, or duplicate user.
func DecodeUsers(data []byte) (map[string]kopiauser.Hash, error) {
	users := map[string]kopiauser.Hash{}
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
		if err := kopiauser.ValidateUsername(name); err != nil {
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
		h := kopiauser.Hash{Version: kopiauser.HashVersion(version), Value: value}
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

// UserSet is what a BSLS's users Secrets should say, and which credential
// Secrets could not be included yet and why.
type UserSet struct {
	// Shards are the users of each users Secret, indexed by ShardOf.
	Shards [UserShards]map[string]kopiauser.Hash
	// Count is the number of users in all shards.
	Count int
	// Pending names (namespace/name) the credential Secrets whose password
	// the controller has not hashed yet.
	Pending []string
	// Refused says, per credential Secret (namespace/name), why its user is
	// not provisioned.
	Refused map[string]string
}

// CollectUsers decides the users of a BSLS from the per-VM credential
// Secrets labelled for it: a Secret counts when its namespace may use the
// server, its username is a valid Kopia identity and its password is
// hashed (hashOf returns nil until then). A username claimed by two Secrets
// is refused for both, so neither VM gets the other's snapshots.
func CollectUsers(secrets []corev1.Secret, allowed func(namespace string) bool, hashOf func(*corev1.Secret) *kopiauser.Hash) UserSet {
	set := UserSet{Refused: map[string]string{}}
	for i := range set.Shards {
		set.Shards[i] = map[string]kopiauser.Hash{}
	}
	owners := map[string][]string{}
	hashes := map[string]kopiauser.Hash{}
	for i := range secrets {
		s := &secrets[i]
		key := s.Namespace + "/" + s.Name
		username := string(s.Data[v1alpha1.SecretKeyUsername])
		switch {
		case !allowed(s.Namespace):
			set.Refused[key] = fmt.Sprintf("namespace %s is not selected by spec.access.namespaceSelector", s.Namespace)
			continue
		case kopiauser.ValidateUsername(username) != nil:
			set.Refused[key] = fmt.Sprintf("key %s: %v", v1alpha1.SecretKeyUsername, kopiauser.ValidateUsername(username))
			continue
		}
		owners[username] = append(owners[username], key)
		if h := hashOf(s); h != nil {
			hashes[username] = *h
		} else {
			set.Pending = append(set.Pending, key)
		}
	}
	for username, keys := range owners {
		if len(keys) > 1 {
			for _, key := range keys {
				set.Refused[key] = fmt.Sprintf("user %s is claimed by %d Secrets: %s", username, len(keys), strings.Join(keys, ", "))
			}
			set.Pending = slices.DeleteFunc(set.Pending, func(k string) bool { return slices.Contains(keys, k) })
			continue
		}
		if h, ok := hashes[username]; ok {
			set.Shards[ShardOf(username)][username] = h
			set.Count++
		}
	}
	slices.Sort(set.Pending)
	return set
}
