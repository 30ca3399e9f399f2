package kopiaserver

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

func hashOf(b byte, version kopiauser.HashVersion) kopiauser.Hash {
	return kopiauser.Hash{Version: version, Value: bytes.Repeat([]byte{b}, 64)}
}

func credential(namespace, vm, username string, hashed bool) corev1.Secret {
	s := corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: vm + "-guestbackup"},
		Data:       map[string][]byte{v1alpha1.SecretKeyUsername: []byte(username)},
	}
	if hashed {
		s.Data["hashed"] = []byte{1}
	}
	return s
}

func TestCollectUsers(t *testing.T) {
	h := hashOf(7, kopiauser.Scrypt)
	hashOfSecret := func(s *corev1.Secret) *kopiauser.Hash {
		if s.Data["hashed"] == nil {
			return nil
		}
		return &h
	}
	allowed := func(ns string) bool { return ns != "other" }
	tests := []struct {
		name        string
		secrets     []corev1.Secret
		wantUsers   []string
		wantPending []string
		wantRefused map[string]string
	}{
		{
			name:      "hashed users of allowed namespaces are written",
			secrets:   []corev1.Secret{credential("a", "web", "web@a", true), credential("b", "db", "db@b", true)},
			wantUsers: []string{"db@b", "web@a"},
		},
		{
			name:        "a user waits for its hash",
			secrets:     []corev1.Secret{credential("a", "web", "web@a", false)},
			wantPending: []string{"a/web-guestbackup"},
		},
		{
			name:        "a namespace the selector leaves out is refused",
			secrets:     []corev1.Secret{credential("other", "web", "web@other", true)},
			wantRefused: map[string]string{"other/web-guestbackup": "namespace other is not selected by spec.access.namespaceSelector"},
		},
		{
			name:        "an invalid Kopia identity is refused",
			secrets:     []corev1.Secret{credential("a", "Web", "Web@a", true)},
			wantRefused: map[string]string{"a/Web-guestbackup": "key username: " + kopiauser.ValidateUsername("Web@a").Error()},
		},
		{
			name:    "one identity claimed twice is refused for both, hashed or not",
			secrets: []corev1.Secret{credential("a", "web", "web@a", true), credential("a", "web2", "web@a", false), credential("b", "db", "db@b", true)},
			wantRefused: map[string]string{
				"a/web-guestbackup":  "user web@a is claimed by 2 Secrets: a/web-guestbackup, a/web2-guestbackup",
				"a/web2-guestbackup": "user web@a is claimed by 2 Secrets: a/web-guestbackup, a/web2-guestbackup",
			},
			wantUsers: []string{"db@b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CollectUsers(tt.secrets, allowed, hashOfSecret)
			var users []string
			for shard, m := range got.Shards {
				for u := range m {
					if userset.ShardOf(u) != shard {
						t.Errorf("user %s in shard %d, want %d", u, shard, userset.ShardOf(u))
					}
					users = append(users, u)
				}
			}
			if len(users) != got.Count {
				t.Errorf("Count = %d, shards hold %d", got.Count, len(users))
			}
			slices.Sort(users)
			if !slices.Equal(users, tt.wantUsers) {
				t.Errorf("users = %v, want %v", users, tt.wantUsers)
			}
			if !slices.Equal(got.Pending, tt.wantPending) {
				t.Errorf("Pending = %v, want %v", got.Pending, tt.wantPending)
			}
			if tt.wantRefused == nil {
				tt.wantRefused = map[string]string{}
			}
			if !reflect.DeepEqual(got.Refused, tt.wantRefused) {
				t.Errorf("Refused = %v, want %v", got.Refused, tt.wantRefused)
			}
		})
	}
}

// BenchmarkCollectUsers10000 is the controller's part of a full resync of
// 10,000 VMs: decide the users from their credential Secrets (parsing each
// stored hash, never hashing) and encode the 16 users Secrets.
func BenchmarkCollectUsers10000(b *testing.B) {
	secrets := make([]corev1.Secret, 10_000)
	for i := range secrets {
		ns, vm := fmt.Sprintf("ns-%d", i%50), fmt.Sprintf("vm-%05d", i)
		secrets[i] = credential(ns, vm, vm+"@"+ns, false)
		secrets[i].Data[v1alpha1.SecretKeyGeneration] = []byte("1")
		secrets[i].Data[v1alpha1.SecretKeyPasswordHashGeneration] = []byte("1")
		secrets[i].Data[v1alpha1.SecretKeyPasswordHash] = []byte(hashOf(byte(i), kopiauser.Scrypt).String())
	}
	for b.Loop() {
		set := CollectUsers(secrets, func(string) bool { return true }, credentials.HashFor)
		if set.Count != len(secrets) {
			b.Fatalf("collected %d users of %d", set.Count, len(secrets))
		}
		for _, shard := range set.Shards {
			_ = userset.Encode(shard)
		}
	}
}
