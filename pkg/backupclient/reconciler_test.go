package backupclient

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// An activity ConfigMap wakes the BackupClients whose identities it lists,
// and nothing for VMs' guests or a ConfigMap that is none.
func TestClientsOfActivity(t *testing.T) {
	shard := func(labelled bool, users ...string) *corev1.ConfigMap {
		guests := map[string]activity.Guest{}
		for _, u := range users {
			guests[u] = activity.Guest{User: u, Snapshots: 1}
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main-activity-3"}, Data: map[string]string{activity.Key: string(activity.Encode(guests))}}
		if labelled {
			cm.Labels = map[string]string{activity.Label: "main"}
		}
		return cm
	}
	for _, tc := range []struct {
		name string
		cm   *corev1.ConfigMap
		want []types.NamespacedName
	}{
		{"clients and VMs", shard(true, "web@shop", "dbdump@shop.client", "db01@backup.client"), []types.NamespacedName{{Namespace: "backup", Name: "db01"}, {Namespace: "shop", Name: "dbdump"}}},
		{"VMs only", shard(true, "web@shop", "db@shop"), nil},
		{"not an activity ConfigMap", shard(false, "dbdump@shop.client"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []types.NamespacedName
			for _, r := range clientsOfActivity(t.Context(), tc.cm) {
				got = append(got, r.NamespacedName)
			}
			slices.SortFunc(got, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("clients %v, want %v", got, tc.want)
			}
		})
	}
}

// The hash of a host's password comes from its admin's Secret, as `kopia
// server user hash-password` prints it; what is missing, unreadable, or
// of an algorithm the server refuses is said, never taken.
func TestOwnHash(t *testing.T) {
	scryptHash, err := identity.NewHash("the admin's own", identity.Scrypt)
	if err != nil {
		t.Fatal(err)
	}
	secret := func(name string, data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: name}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	reader := fake.NewClientBuilder().WithObjects(
		secret("good", map[string]string{"passwordHash": scryptHash.String() + "\n"}),
		secret("other-key", map[string]string{"hash": scryptHash.String()}),
		secret("typo", map[string]string{"passwordHash": "eyJwYXNzd29yZEhhc2hWZXJzaW9uIjox"}),
	).Build()
	r := &Reconciler{APIReader: reader}
	fips := readyServer()
	fips.Namespace, fips.Spec.Access.PasswordHash = "backup", v1alpha1.PasswordHashPBKDF2
	for _, tc := range []struct {
		name, secret, key string
		server            *v1alpha1.BackupStorageLocationServer
		problem           string // a part of it; "" for the hash
	}{
		{name: "the hash, trimmed", secret: "good", server: readyServer()},
		{name: "another key", secret: "other-key", key: "hash", server: readyServer()},
		{name: "no such Secret", secret: "gone", server: readyServer(), problem: "Secret gone, which spec.passwordHash names, does not exist in namespace backup"},
		{name: "no such key", secret: "other-key", server: readyServer(), problem: "Secret other-key has no key passwordHash"},
		{name: "no hash", secret: "typo", server: readyServer(), problem: "key passwordHash of Secret typo holds no password hash"},
		{name: "a server of another algorithm", secret: "good", server: fips, problem: "holds a scrypt hash, and BackupStorageLocationServer backup/main takes pbkdf2 hashes only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testClient(func(c *v1alpha1.BackupClient) {
				c.Namespace, c.Spec.PasswordHash = "backup", &v1alpha1.PasswordHashSource{SecretName: tc.secret, Key: tc.key}
			})
			h, problem, err := r.ownHash(t.Context(), c, tc.server)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.problem == "" && (h == nil || !h.Equal(scryptHash) || problem != ""):
				t.Errorf("hash %v, problem %q; want the Secret's hash", h, problem)
			case tc.problem != "" && (h != nil || !strings.Contains(problem, tc.problem)):
				t.Errorf("hash %v, problem %q; want none, and a problem with %q", h, problem, tc.problem)
			}
		})
	}
}
