package backupclient

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

var (
	now      = metav1.NewTime(time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC))
	endpoint = clientsecret.Server{URL: "https://main.backup.svc:51515", CA: "-----BEGIN CERTIFICATE-----\n"}
	hash1    = identity.Hash{Version: identity.Scrypt, Value: bytes.Repeat([]byte{1}, 64)}
	hash2    = identity.Hash{Version: identity.Scrypt, Value: bytes.Repeat([]byte{2}, 64)}
)

// testPassword is the password of the tests' Secrets, which no Event tells.
const testPassword = "pw-7f3a9c"

func testClient(mutate ...func(*v1alpha1.BackupClient)) *v1alpha1.BackupClient {
	c := &v1alpha1.BackupClient{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "dbdump", UID: "uid-1", Generation: 3},
		Spec:       v1alpha1.BackupClientSpec{Server: v1alpha1.ServerReference{Namespace: "backup", Name: "main"}},
	}
	for _, m := range mutate {
		m(c)
	}
	return c
}

func readyServer() *v1alpha1.BackupStorageLocationServer {
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main"}}
	b.Status.Endpoint, b.Status.TLSCA = endpoint.URL, endpoint.CA
	return b
}

// ownSecret is the client's Secret of generation g with hash h, issued
// for spec.rotate rotate.
func ownSecret(c *v1alpha1.BackupClient, g int64, h identity.Hash, rotate string) *corev1.Secret {
	return clientsecret.Render(c, endpoint, clientsecret.Credentials{Generation: g, Password: testPassword, Hash: h, Rotate: rotate})
}

func withReady(status metav1.ConditionStatus, reason string) func(*v1alpha1.BackupClient) {
	return func(c *v1alpha1.BackupClient) {
		c.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: status, Reason: reason}}
	}
}

func TestDecide(t *testing.T) {
	vmSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-guestbackup", OwnerReferences: []metav1.OwnerReference{{Kind: "VirtualMachine", Name: "db", UID: "vm", Controller: new(bool)}}}}
	*vmSecret.OwnerReferences[0].Controller = true
	earlier := ownSecret(testClient(func(c *v1alpha1.BackupClient) { c.UID = "uid-0" }), 4, hash1, "")
	movedServer := readyServer()
	movedServer.Status.Endpoint = "https://backup.example.com:51515"
	// A host the server's admin declares in the server's namespace, with
	// the hash of their own password; a tenant asking for the same.
	host := func(mutate ...func(*v1alpha1.BackupClient)) *v1alpha1.BackupClient {
		return testClient(append([]func(*v1alpha1.BackupClient){func(c *v1alpha1.BackupClient) {
			c.Namespace, c.Spec.PasswordHash = "backup", &v1alpha1.PasswordHashSource{SecretName: "dbdump-hash"}
		}}, mutate...)...)
	}
	hostSecret := func(g int64, h identity.Hash) *corev1.Secret {
		return clientsecret.Render(host(), endpoint, clientsecret.Credentials{Generation: g, Hash: h})
	}
	tenantsOwn := testClient(func(c *v1alpha1.BackupClient) { c.Spec.PasswordHash = &v1alpha1.PasswordHashSource{SecretName: "mine"} })

	for _, tc := range []struct {
		name        string
		in          inputs
		secret      secretAction
		generation  int64
		status      metav1.ConditionStatus
		reason      string
		message     string // a part of Ready's message
		events      []string
		credentials int64
	}{{
		name:   "no such server: no credentials",
		in:     inputs{Client: testClient()},
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonServerNotFound,
		message: "BackupStorageLocationServer backup/main does not exist",
		events:  []string{"Warning ServerNotFound"},
	}, {
		name:   "the server went: the credentials go",
		in:     inputs{Client: testClient(withReady(metav1.ConditionTrue, v1alpha1.BackupClientReasonProvisioned)), Secret: ownSecret(testClient(), 2, hash1, "")},
		secret: secretDelete,
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonServerNotFound,
		events: []string{"Normal CredentialsWithdrawn", "Warning ServerNotFound"},
	}, {
		name:   "a namespace the server does not admit: no user, no credentials",
		in:     inputs{Client: testClient(), Server: readyServer()},
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonNamespaceNotAdmitted,
		message: "does not admit namespace shop",
		events:  []string{"Warning NamespaceNotAdmitted"},
	}, {
		name:   "a namespace no longer admitted: the credentials go",
		in:     inputs{Client: testClient(), Server: readyServer(), Secret: ownSecret(testClient(), 1, hash1, ""), Provisioned: &hash1},
		secret: secretDelete,
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonNamespaceNotAdmitted,
		events: []string{"Normal CredentialsWithdrawn", "Warning NamespaceNotAdmitted"},
	}, {
		name:   "still not admitted: said once",
		in:     inputs{Client: testClient(withReady(metav1.ConditionFalse, v1alpha1.BackupClientReasonNamespaceNotAdmitted)), Server: readyServer()},
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonNamespaceNotAdmitted,
	}, {
		name:   "a VM's Secret under the name: never written over",
		in:     inputs{Client: testClient(func(c *v1alpha1.BackupClient) { c.Spec.SecretName = "db-guestbackup" }), Server: readyServer(), Admitted: true, Secret: vmSecret},
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonSecretConflict,
		message: "Secret db-guestbackup exists and is not this BackupClient's (controlled by VirtualMachine db)",
		events:  []string{"Warning SecretConflict"},
	}, {
		name:   "the Secret of an earlier client of the name: left to the garbage collector",
		in:     inputs{Client: testClient(), Server: readyServer(), Admitted: true, Secret: earlier, Provisioned: &hash1},
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonSecretConflict,
		events: []string{"Warning SecretConflict"},
	}, {
		name:   "a server without endpoint yet: wait",
		in:     inputs{Client: testClient(), Server: &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main"}}, Admitted: true},
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonServerNotReady,
		events: []string{"Warning ServerNotReady"},
	}, {
		name:   "first credentials",
		in:     inputs{Client: testClient(), Server: readyServer(), Admitted: true},
		secret: secretIssue, generation: 1, credentials: 1,
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonProvisioning,
		events: []string{"Normal CredentialsIssued"},
	}, {
		name:        "issued, not on the server yet",
		in:          inputs{Client: testClient(), Server: readyServer(), Admitted: true, Secret: ownSecret(testClient(), 1, hash1, "")},
		credentials: 1,
		status:      metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonProvisioning,
	}, {
		name:        "provisioned",
		in:          inputs{Client: testClient(), Server: readyServer(), Admitted: true, Secret: ownSecret(testClient(), 1, hash1, ""), Provisioned: &hash1},
		credentials: 1,
		status:      metav1.ConditionTrue, reason: v1alpha1.BackupClientReasonProvisioned,
		message: "User dbdump@shop.client is provisioned on BackupStorageLocationServer backup/main with credentials generation 1",
		events:  []string{"Normal UserProvisioned"},
	}, {
		name:        "provisioned, and said so before",
		in:          inputs{Client: testClient(withReady(metav1.ConditionTrue, v1alpha1.BackupClientReasonProvisioned)), Server: readyServer(), Admitted: true, Secret: ownSecret(testClient(), 1, hash1, ""), Provisioned: &hash1},
		credentials: 1,
		status:      metav1.ConditionTrue, reason: v1alpha1.BackupClientReasonProvisioned,
	}, {
		name:        "the server holds another generation's hash",
		in:          inputs{Client: testClient(withReady(metav1.ConditionTrue, v1alpha1.BackupClientReasonProvisioned)), Server: readyServer(), Admitted: true, Secret: ownSecret(testClient(), 2, hash2, ""), Provisioned: &hash1},
		credentials: 2,
		status:      metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonProvisioning,
	}, {
		name:   "spec.rotate changed: a new generation",
		in:     inputs{Client: testClient(func(c *v1alpha1.BackupClient) { c.Spec.Rotate = "2026-12" }), Server: readyServer(), Admitted: true, Secret: ownSecret(testClient(), 1, hash1, ""), Provisioned: &hash1},
		secret: secretIssue, generation: 2, credentials: 2,
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonProvisioning,
		events: []string{"Normal CredentialsRotated"},
	}, {
		name:   "the server moved: same credentials, new URL",
		in:     inputs{Client: testClient(), Server: movedServer, Admitted: true, Secret: ownSecret(testClient(), 1, hash1, ""), Provisioned: &hash1},
		secret: secretRefresh, credentials: 1,
		status: metav1.ConditionTrue, reason: v1alpha1.BackupClientReasonProvisioned,
		events: []string{"Normal UserProvisioned"},
	}, {
		name:   "a tenant's client with a password of its own: no user",
		in:     inputs{Client: tenantsOwn, Server: readyServer(), Admitted: true},
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonPasswordHashNotAllowed,
		message: "only the admin of BackupStorageLocationServer backup/main does, in its namespace backup",
		events:  []string{"Warning PasswordHashNotAllowed"},
	}, {
		name:   "a tenant's client switched to a password of its own: its credentials go",
		in:     inputs{Client: tenantsOwn, Server: readyServer(), Admitted: true, Secret: ownSecret(testClient(), 1, hash1, ""), Provisioned: &hash1, OwnHash: &hash2},
		secret: secretDelete,
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonPasswordHashNotAllowed,
		events: []string{"Normal CredentialsWithdrawn", "Warning PasswordHashNotAllowed"},
	}, {
		name:   "a host whose hash cannot be read: no user",
		in:     inputs{Client: host(), Server: readyServer(), Admitted: true, HashProblem: "Secret dbdump-hash has no key passwordHash"},
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonPasswordHashInvalid,
		message: "Secret dbdump-hash has no key passwordHash; no user is provisioned until it does",
		events:  []string{"Warning PasswordHashInvalid"},
	}, {
		name:        "a working host whose hash Secret went or holds a typo: it keeps its hash",
		in:          inputs{Client: host(withReady(metav1.ConditionTrue, v1alpha1.BackupClientReasonProvisioned)), Server: readyServer(), Admitted: true, HashProblem: "Secret dbdump-hash, which spec.passwordHash names, does not exist in namespace backup", Secret: hostSecret(2, hash1), Provisioned: &hash1},
		credentials: 2,
		status:      metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonPasswordHashInvalid,
		message: "does not exist in namespace backup; the server keeps the hash of credentials generation 2 until it does",
		events:  []string{"Warning PasswordHashInvalid"},
	}, {
		name:   "a host's first credentials: its admin's hash, no password",
		in:     inputs{Client: host(), Server: readyServer(), Admitted: true, OwnHash: &hash1},
		secret: secretIssue, generation: 1, credentials: 1,
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonProvisioning,
		events: []string{"Normal CredentialsIssued"},
	}, {
		name:        "a host provisioned with its admin's hash",
		in:          inputs{Client: host(), Server: readyServer(), Admitted: true, OwnHash: &hash1, Secret: hostSecret(1, hash1), Provisioned: &hash1},
		credentials: 1,
		status:      metav1.ConditionTrue, reason: v1alpha1.BackupClientReasonProvisioned,
		events: []string{"Normal UserProvisioned"},
	}, {
		name:   "a host's admin wrote a new hash: a new generation",
		in:     inputs{Client: host(withReady(metav1.ConditionTrue, v1alpha1.BackupClientReasonProvisioned)), Server: readyServer(), Admitted: true, OwnHash: &hash2, Secret: hostSecret(1, hash1), Provisioned: &hash1},
		secret: secretIssue, generation: 2, credentials: 2,
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonProvisioning,
		events: []string{"Normal CredentialsRotated"},
	}, {
		name:        "a host's spec.rotate is not its admin's hash: nothing changes",
		in:          inputs{Client: host(withReady(metav1.ConditionTrue, v1alpha1.BackupClientReasonProvisioned), func(c *v1alpha1.BackupClient) { c.Spec.Rotate = "x" }), Server: readyServer(), Admitted: true, OwnHash: &hash1, Secret: hostSecret(1, hash1), Provisioned: &hash1},
		credentials: 1,
		status:      metav1.ConditionTrue, reason: v1alpha1.BackupClientReasonProvisioned,
	}, {
		name:   "a host's spec.passwordHash removed: a password is generated",
		in:     inputs{Client: host(func(c *v1alpha1.BackupClient) { c.Spec.PasswordHash = nil }), Server: readyServer(), Admitted: true, Secret: hostSecret(1, hash1), Provisioned: &hash1},
		secret: secretIssue, generation: 2, credentials: 2,
		status: metav1.ConditionFalse, reason: v1alpha1.BackupClientReasonProvisioning,
		events: []string{"Normal CredentialsRotated"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = now
			p := decide(tc.in)
			if p.Secret != tc.secret || p.Generation != tc.generation {
				t.Errorf("secret: %s generation %d, want %s generation %d", p.Secret, p.Generation, tc.secret, tc.generation)
			}
			if want := "dbdump@" + tc.in.Client.Namespace + ".client"; p.Status.Identity != want {
				t.Errorf("identity %q, want %s", p.Status.Identity, want)
			}
			if p.Status.CredentialsGeneration != tc.credentials {
				t.Errorf("credentialsGeneration %d, want %d", p.Status.CredentialsGeneration, tc.credentials)
			}
			if p.Status.ObservedGeneration != 3 {
				t.Errorf("observedGeneration %d, want 3", p.Status.ObservedGeneration)
			}
			ready := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
			if ready == nil || ready.Status != tc.status || ready.Reason != tc.reason || !strings.Contains(ready.Message, tc.message) {
				t.Errorf("Ready = %+v, want %s %s containing %q", ready, tc.status, tc.reason, tc.message)
			}
			var events []string
			for _, e := range p.Events {
				events = append(events, e.Type+" "+e.Reason)
				if strings.Contains(e.Message, testPassword) {
					t.Errorf("event %q tells the password", e.Message)
				}
			}
			if strings.Join(events, ",") != strings.Join(tc.events, ",") {
				t.Errorf("events %v, want %v", events, tc.events)
			}
		})
	}
}

// What the server publishes of a client's snapshots reaches its status,
// and each new newest snapshot is an Event, as a VM's audit announces its
// guest's.
func TestObserve(t *testing.T) {
	at := time.Date(2026, 12, 7, 7, 0, 0, 0, time.UTC)
	published := func(id string, count int) *activity.Guest {
		return &activity.Guest{User: "dbdump@shop.client", Snapshots: count, First: at,
			Last: activity.Snapshot{ID: id, Path: "/data", Start: at, End: at.Add(1500 * time.Millisecond), Bytes: 2048, Files: 3}}
	}
	seen := func(id string, count int32) func(*v1alpha1.BackupClient) {
		return func(c *v1alpha1.BackupClient) {
			c.Status.Snapshots = count
			c.Status.LastSnapshot = &v1alpha1.GuestSnapshotSummary{ID: id, Path: "/data"}
		}
	}
	for _, tc := range []struct {
		name     string
		client   *v1alpha1.BackupClient
		activity *activity.Guest
		lastID   string
		count    int32
		event    string
	}{{
		name: "nothing published, nothing seen", client: testClient(),
	}, {
		name: "a first snapshot", client: testClient(), activity: published("k1", 1),
		lastID: "k1", count: 1,
		event: "Normal SnapshotCreated Snapshot k1 of /data: 2048 bytes in 3 files, taken in 1.5s, ended 2026-12-07T07:00:01Z; snapshots kept: 1",
	}, {
		name: "the same newest snapshot: said once", client: testClient(seen("k1", 1)), activity: published("k1", 1),
		lastID: "k1", count: 1,
	}, {
		name: "a newer one", client: testClient(seen("k1", 1)), activity: published("k2", 2),
		lastID: "k2", count: 2, event: "Normal SnapshotCreated Snapshot k2 of /data",
	}, {
		name: "no longer published: the last known stays", client: testClient(seen("k2", 2)),
		lastID: "k2", count: 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p := decide(inputs{Client: tc.client, Server: readyServer(), Admitted: true, Activity: tc.activity, Now: now})
			if got := p.Status.LastSnapshot; tc.lastID == "" && got != nil || tc.lastID != "" && (got == nil || got.ID != tc.lastID) {
				t.Errorf("lastSnapshot %+v, want %q", got, tc.lastID)
			}
			if p.Status.Snapshots != tc.count {
				t.Errorf("snapshots %d, want %d", p.Status.Snapshots, tc.count)
			}
			var events []string
			for _, e := range p.Events {
				if e.Reason == audit.ReasonSnapshotCreated {
					events = append(events, e.Type+" "+e.Reason+" "+e.Message)
				}
			}
			if got := strings.Join(events, "\n"); tc.event == "" && got != "" || !strings.HasPrefix(got, tc.event) {
				t.Errorf("events %q, want %q", got, tc.event)
			}
		})
	}
}
