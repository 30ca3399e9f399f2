package kopiaserver

import (
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// backupClient is BackupClient namespace/name of UID "uid-<name>" naming
// server.
func backupClient(namespace, name string, server types.NamespacedName) v1alpha1.BackupClient {
	return v1alpha1.BackupClient{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1alpha1.BackupClientSpec{Server: v1alpha1.ServerReference{Namespace: server.Namespace, Name: server.Name}},
	}
}

// clientSecretOf is c's Secret as its reconciler renders it, with hash h.
func clientSecretOf(c v1alpha1.BackupClient, h identity.Hash) *corev1.Secret {
	return clientsecret.Render(&c, clientsecret.Server{URL: "https://main.backup.svc:51515", CA: "CA"}, clientsecret.Credentials{Generation: 1, Password: "pw", Hash: h})
}

func TestCollectClients(t *testing.T) {
	h := hashOf(7, identity.Scrypt)
	other := types.NamespacedName{Namespace: "backup", Name: "other"}
	deleting := backupClient("team-a", "going", testServer)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	// A client of the same name as an earlier one, whose Secret the
	// earlier one still controls.
	recreated := backupClient("team-a", "again", testServer)
	staleSecret := clientSecretOf(recreated, h)
	recreated.UID = "uid-again-2"
	// A client whose spec.secretName is a VM's credential Secret, which it
	// does not control.
	collides := backupClient("team-a", "db", testServer)
	collides.Spec.SecretName = "db-guestbackup"
	vmSecret := credential("team-a", "db", true)

	// A host the server's admin declares in the server's namespace, which
	// the selector does not admit, with the hash of their own password;
	// and a tenant's client asking for the same.
	host := backupClient(testServer.Namespace, "db01", testServer)
	host.Spec.PasswordHash = &v1alpha1.PasswordHashSource{SecretName: "db01-hash"}
	tenantsOwn := backupClient("team-a", "own", testServer)
	tenantsOwn.Spec.PasswordHash = &v1alpha1.PasswordHashSource{SecretName: "own-hash"}

	clients := []v1alpha1.BackupClient{
		backupClient("team-a", "dump", testServer),
		backupClient("team-a", "waits", testServer),
		backupClient("team-b", "dump", testServer), // namespace not admitted
		backupClient("team-a", "elsewhere", other),
		deleting, recreated, collides, host, tenantsOwn,
	}
	secrets := map[types.NamespacedName]*corev1.Secret{}
	for _, s := range []*corev1.Secret{clientSecretOf(clients[0], h), clientSecretOf(clients[2], h), clientSecretOf(clients[3], h), clientSecretOf(deleting, h), staleSecret, &vmSecret,
		clientSecretOf(host, h), clientSecretOf(tenantsOwn, h)} {
		secrets[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}

	set := UserSet{Refused: map[string]string{}}
	for i := range set.Shards {
		set.Shards[i] = map[string]identity.Hash{}
	}
	CollectClients(&set, ClientInputs{Server: testServer, Clients: clients, Secrets: secrets, Allowed: func(ns string) bool { return ns == "team-a" }})

	users := map[string]identity.Hash{}
	for _, shard := range set.Shards {
		maps.Copy(users, shard)
	}
	if want := []string{"db01@" + testServer.Namespace + ".client", "dump@team-a.client"}; !slices.Equal(slices.Sorted(maps.Keys(users)), want) {
		t.Errorf("users = %v, want %v", slices.Sorted(maps.Keys(users)), want)
	}
	if got := set.Shards[userset.ShardOf("dump@team-a.client")]["dump@team-a.client"]; !got.Equal(h) {
		t.Errorf("dump@team-a.client has hash %v, want its Secret's", got)
	}
	if set.Count != 2 {
		t.Errorf("Count = %d, want 2", set.Count)
	}
	if want := []string{"team-a/again-backupclient", "team-a/db-guestbackup", "team-a/waits-backupclient"}; !slices.Equal(set.Pending, want) {
		t.Errorf("Pending = %v, want %v", set.Pending, want)
	}
	if _, ok := users["db@team-a"]; ok {
		t.Error("a client whose secretName is a VM's Secret took the VM's identity")
	}
}
