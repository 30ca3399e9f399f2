package kopiaserver

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// UserSet is what a BSLS's users Secrets should say, and which credential
// Secrets could not be included yet and why.
type UserSet struct {
	// Shards are the users of each users Secret, indexed by userset.ShardOf.
	Shards [userset.Shards]map[string]kopiauser.Hash
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
			set.Shards[userset.ShardOf(username)][username] = h
			set.Count++
		}
	}
	slices.Sort(set.Pending)
	return set
}
