package kopiaserver

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

func hashOf(b byte, version identity.HashVersion) identity.Hash {
	return identity.Hash{Version: version, Value: bytes.Repeat([]byte{b}, 64)}
}

// testServer is the BSLS the CollectUsers tests collect for.
var testServer = types.NamespacedName{Namespace: "backup", Name: "main"}

// credential is VM vm's Secret in namespace as the webhook writes it for
// testServer and the VM reconciler adopts it: controlled by VM vm of UID
// "uid-<vm>".
func credential(namespace, vm string, hashed bool, opts ...func(*corev1.Secret)) corev1.Secret {
	s := corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: vm + "-guestbackup",
			Labels:          vmsecret.Labels(vm, testServer),
			OwnerReferences: []metav1.OwnerReference{vmsecret.OwnerReference(vm, types.UID("uid-"+vm))},
		},
		Data: map[string][]byte{v1alpha1.SecretKeyUsername: []byte(vm + "@" + namespace)},
	}
	if hashed {
		s.Data["hashed"] = []byte{1}
	}
	for _, o := range opts {
		o(&s)
	}
	return s
}

// vmMeta is VM namespace/name of UID "uid-<name>", naming server ("" for
// no annotation).
func vmMeta(namespace, name, server string) *metav1.PartialObjectMetadata {
	vm := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + name)}}
	if server != "" {
		vm.Annotations = map[string]string{v1alpha1.AnnotationServer: server}
	}
	return vm
}

// collectNow is the time TestCollectUsers judges the Secrets' ages at.
var collectNow = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func TestCollectUsers(t *testing.T) {
	h := hashOf(7, identity.Scrypt)
	hashOfSecret := func(s *corev1.Secret) *identity.Hash {
		if s.Data["hashed"] == nil {
			return nil
		}
		return &h
	}
	allowed := func(ns string) bool { return ns != "other" }
	main := testServer.String()
	// The VMs that exist, unless a case says otherwise.
	vms := []*metav1.PartialObjectMetadata{
		vmMeta("a", "web", main), vmMeta("b", "db", main), vmMeta("other", "web", main),
		vmMeta("a", "moved", "backup/second"), vmMeta("a", "out", ""),
	}
	labelVM := func(vm string) func(*corev1.Secret) {
		return func(s *corev1.Secret) { s.Labels[v1alpha1.LabelVM] = vm }
	}
	owners := func(refs ...metav1.OwnerReference) func(*corev1.Secret) {
		return func(s *corev1.Secret) { s.OwnerReferences = refs }
	}
	username := func(u string) func(*corev1.Secret) {
		return func(s *corev1.Secret) { s.Data[v1alpha1.SecretKeyUsername] = []byte(u) }
	}
	tests := []struct {
		name        string
		secrets     []corev1.Secret
		vms         []*metav1.PartialObjectMetadata // nil: vms
		wantUsers   []string
		wantPending []string
		wantRefused map[string]string
	}{
		{
			name:      "the users of VMs that control their Secret and name this server are written",
			secrets:   []corev1.Secret{credential("a", "web", true), credential("b", "db", true)},
			wantUsers: []string{"db@b", "web@a"},
		},
		{
			name:        "a user waits for its hash",
			secrets:     []corev1.Secret{credential("a", "web", false)},
			wantPending: []string{"a/web-guestbackup"},
		},
		{
			name:        "a Secret its VM has not adopted yet waits",
			secrets:     []corev1.Secret{credential("a", "web", true, owners())},
			wantPending: []string{"a/web-guestbackup"},
		},
		{
			name:        "a Secret a previous VM of that name (another UID) controls waits for the new VM to adopt it",
			secrets:     []corev1.Secret{credential("a", "web", true, owners(vmsecret.OwnerReference("web", "uid-previous")))},
			wantPending: []string{"a/web-guestbackup"},
		},
		{
			name:        "a Secret its VM owns without controlling it waits to be adopted as its controller",
			secrets:     []corev1.Secret{credential("a", "web", true, owners(metav1.OwnerReference{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "web", UID: "uid-web"}))},
			wantPending: []string{"a/web-guestbackup"},
		},
		{
			name:        "a namespace the selector leaves out is refused",
			secrets:     []corev1.Secret{credential("other", "web", true)},
			wantRefused: map[string]string{"other/web-guestbackup": "namespace other is not selected by spec.access.namespaceSelector"},
		},
		{
			name:        "a VM name that is no Kopia identity is refused",
			secrets:     []corev1.Secret{credential("a", "Web", true)},
			vms:         []*metav1.PartialObjectMetadata{vmMeta("a", "Web", main)},
			wantRefused: map[string]string{"a/Web-guestbackup": "VirtualMachine a/Web has no valid Kopia identity: " + identity.ValidateUsername("Web@a").Error()},
		},
		{
			name:        "a Secret without a VM label is refused",
			secrets:     []corev1.Secret{credential("a", "web", true, func(s *corev1.Secret) { delete(s.Labels, v1alpha1.LabelVM) })},
			wantRefused: map[string]string{"a/web-guestbackup": "it has no label guestbackup.io/vm naming its VirtualMachine"},
		},
		{
			name: "a Secret not named after the VM it is labelled for is refused",
			// A forged Secret: another name, labelled for a VM.
			secrets:     []corev1.Secret{credential("a", "evil", true, labelVM("web"))},
			wantRefused: map[string]string{"a/evil-guestbackup": "its label guestbackup.io/vm=web names VirtualMachine web, whose credential Secret can only be web-guestbackup"},
		},
		{
			name: "a Secret no VM controls, of a VM not stored yet, waits out the admission grace",
			// The webhook writes it while it admits the VM.
			secrets: []corev1.Secret{credential("a", "new", true, owners(), func(s *corev1.Secret) {
				s.CreationTimestamp = metav1.NewTime(collectNow.Add(-AdmissionGrace + time.Second))
			})},
			wantPending: []string{"a/new-guestbackup"},
		},
		{
			name: "a Secret no VM controls, of a VM still not stored after the admission grace, is refused",
			secrets: []corev1.Secret{credential("a", "new", true, owners(), func(s *corev1.Secret) {
				s.CreationTimestamp = metav1.NewTime(collectNow.Add(-AdmissionGrace))
			})},
			wantRefused: map[string]string{"a/new-guestbackup": "VirtualMachine a/new does not exist: a user is provisioned only for an existing VM that names this server"},
		},
		{
			name: "a young Secret its VM controlled is refused once the VM is gone: no grace",
			secrets: []corev1.Secret{credential("a", "ghost", true, func(s *corev1.Secret) {
				s.CreationTimestamp = metav1.NewTime(collectNow)
			})},
			wantRefused: map[string]string{"a/ghost-guestbackup": "VirtualMachine a/ghost does not exist: a user is provisioned only for an existing VM that names this server"},
		},
		{
			name:        "a Secret of a VM that does not exist is refused",
			secrets:     []corev1.Secret{credential("a", "ghost", true)},
			wantRefused: map[string]string{"a/ghost-guestbackup": "VirtualMachine a/ghost does not exist: a user is provisioned only for an existing VM that names this server"},
		},
		{
			name:        "a Secret whose VM names another server is refused",
			secrets:     []corev1.Secret{credential("a", "moved", true)},
			wantRefused: map[string]string{"a/moved-guestbackup": "VirtualMachine a/moved names server backup/second in annotation guestbackup.io/server, not this one"},
		},
		{
			name:        "a Secret whose VM opted out is refused",
			secrets:     []corev1.Secret{credential("a", "out", true)},
			wantRefused: map[string]string{"a/out-guestbackup": "VirtualMachine a/out has no annotation guestbackup.io/server"},
		},
		{
			name: "a Secret another object controls is refused",
			secrets: []corev1.Secret{credential("a", "web", true, owners(metav1.OwnerReference{
				APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d", Controller: ptr.To(true),
			}))},
			wantRefused: map[string]string{"a/web-guestbackup": "it is controlled by Deployment web, not by VirtualMachine web"},
		},
		{
			name:        "a Secret another VM controls is refused",
			secrets:     []corev1.Secret{credential("a", "web", true, owners(vmsecret.OwnerReference("db", "uid-db")))},
			wantRefused: map[string]string{"a/web-guestbackup": "it is controlled by VirtualMachine db, not by VirtualMachine web"},
		},
		{
			name: "a username key that names another identity is refused, and claims nothing",
			// The attack: a Secret in a says it is db@b; db@b's own
			// Secret is untouched by it.
			secrets:     []corev1.Secret{credential("a", "web", true, username("db@b")), credential("b", "db", true)},
			wantUsers:   []string{"db@b"},
			wantRefused: map[string]string{"a/web-guestbackup": `its key username says "db@b", but its VirtualMachine's identity is web@a: the key is guestbackup's, not for editing; admit the VM again (any change to it) and the webhook rewrites it`},
		},
		{
			name:      "a Secret without a username key is provisioned from facts",
			secrets:   []corev1.Secret{credential("a", "web", true, func(s *corev1.Secret) { delete(s.Data, v1alpha1.SecretKeyUsername) })},
			wantUsers: []string{"web@a"},
		},
		{
			name: "forged Secrets for a victim's identity never cost the victim its user",
			secrets: []corev1.Secret{
				credential("b", "db", true),
				credential("a", "evil", true, labelVM("db"), username("db@b")),
				credential("a", "db", true, username("db@b"), owners()),
			},
			wantUsers: []string{"db@b"},
			wantRefused: map[string]string{
				"a/evil-guestbackup": "its label guestbackup.io/vm=db names VirtualMachine db, whose credential Secret can only be db-guestbackup",
				"a/db-guestbackup":   "VirtualMachine a/db does not exist: a user is provisioned only for an existing VM that names this server",
			},
		},
		{
			name:    "a user is provisioned while its VM is being deleted (the VM reconciler revokes it)",
			secrets: []corev1.Secret{credential("a", "web", true)},
			vms: []*metav1.PartialObjectMetadata{func() *metav1.PartialObjectMetadata {
				vm := vmMeta("a", "web", main)
				vm.DeletionTimestamp = &metav1.Time{}
				return vm
			}()},
			wantUsers: []string{"web@a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			index := map[types.NamespacedName]*metav1.PartialObjectMetadata{}
			known := tt.vms
			if known == nil {
				known = vms
			}
			for _, vm := range known {
				index[types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}] = vm
			}
			got := CollectUsers(UserInputs{Server: testServer, Secrets: tt.secrets, VMs: index, Allowed: allowed, HashOf: hashOfSecret, Now: collectNow})
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
	vms := map[types.NamespacedName]*metav1.PartialObjectMetadata{}
	for i := range secrets {
		ns, vm := fmt.Sprintf("ns-%d", i%50), fmt.Sprintf("vm-%05d", i)
		secrets[i] = credential(ns, vm, false)
		vms[types.NamespacedName{Namespace: ns, Name: vm}] = vmMeta(ns, vm, testServer.String())
		secrets[i].Data[v1alpha1.SecretKeyGeneration] = []byte("1")
		secrets[i].Data[v1alpha1.SecretKeyPasswordHashGeneration] = []byte("1")
		secrets[i].Data[v1alpha1.SecretKeyPasswordHash] = []byte(hashOf(byte(i), identity.Scrypt).String())
	}
	for b.Loop() {
		set := CollectUsers(UserInputs{Server: testServer, Secrets: secrets, VMs: vms, Allowed: func(string) bool { return true }, HashOf: credentials.HashFor})
		if set.Count != len(secrets) {
			b.Fatalf("collected %d users of %d", set.Count, len(secrets))
		}
		for _, shard := range set.Shards {
			_ = userset.Encode(shard)
		}
	}
}

// TestCollectGrants: a provisioned VM's annotation guestbackup.io/restore-from
// grants its identity read access to another identity of its own
// namespace, and nothing else.
func TestCollectGrants(t *testing.T) {
	h := hashOf(7, identity.Scrypt)
	main := testServer.String()
	restoreFrom := func(vm *metav1.PartialObjectMetadata, value string) *metav1.PartialObjectMetadata {
		vm.Annotations[v1alpha1.AnnotationRestoreFrom] = value
		return vm
	}
	tests := []struct {
		name        string
		value       string
		hashed      bool
		wantGrant   string
		wantRefusal string
	}{
		{name: "a VM of the namespace, deleted or not", value: "old", hashed: true, wantGrant: "web@team-a old@team-a"},
		{name: "another namespace by slash", value: "team-b/old", hashed: true, wantRefusal: "a VM of another namespace can never be named"},
		{name: "another namespace by identity", value: "old@team-b", hashed: true, wantRefusal: "a VM of another namespace can never be named"},
		{name: "itself", value: "web", hashed: true, wantRefusal: "it names this VM itself"},
		{name: "no name", value: "Not A Name", hashed: true, wantRefusal: "it is not a VirtualMachine name"},
		{name: "empty", value: "", hashed: true, wantRefusal: "it is not a VirtualMachine name"},
		{name: "a VM whose user is not provisioned grants nothing yet", value: "old", hashed: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vm := restoreFrom(vmMeta("team-a", "web", main), tt.value)
			got := CollectUsers(UserInputs{
				Server: testServer, Secrets: []corev1.Secret{credential("team-a", "web", tt.hashed)},
				VMs:     map[types.NamespacedName]*metav1.PartialObjectMetadata{{Namespace: "team-a", Name: "web"}: vm},
				Allowed: func(string) bool { return true },
				HashOf: func(s *corev1.Secret) *identity.Hash {
					if s.Data["hashed"] == nil {
						return nil
					}
					return &h
				},
			})
			var grants []string
			for shard, gs := range got.Grants {
				for _, g := range gs {
					if userset.ShardOf(g.Grantee) != shard {
						t.Errorf("grant %v in shard %d, want the grantee's", g, shard)
					}
					grants = append(grants, g.Grantee+" "+g.Source)
				}
			}
			if want := []string{tt.wantGrant}; tt.wantGrant == "" && len(grants) != 0 || tt.wantGrant != "" && !slices.Equal(grants, want) {
				t.Errorf("grants %v, want %q", grants, tt.wantGrant)
			}
			refusal := got.GrantsRefused[types.NamespacedName{Namespace: "team-a", Name: "web"}]
			if tt.wantRefusal == "" && refusal != "" || !strings.Contains(refusal, tt.wantRefusal) {
				t.Errorf("refusal %q, want one saying %q", refusal, tt.wantRefusal)
			}
		})
	}
}
