package kopiaserver

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// UserSet is what a BSLS's users Secrets should say, and which credential
// Secrets could not be included yet and why.
type UserSet struct {
	// Shards are the users of each users Secret, indexed by userset.ShardOf.
	Shards [userset.Shards]map[string]identity.Hash
	// Count is the number of users in all shards.
	Count int
	// Pending names (namespace/name) the credential Secrets of VMs that
	// use this server whose user is not provisioned yet: the controller has
	// not hashed the password, or the VM has not adopted the Secret yet.
	Pending []string
	// Refused says, per credential Secret (namespace/name), why its user is
	// not provisioned.
	Refused map[string]string
	// Grants are the restore grants of each shard's users (the grantees'),
	// indexed by userset.ShardOf of the grantee.
	Grants [userset.Shards][]userset.Grant
	// GrantsRefused says, per provisioned VM, why its annotation
	// guestbackup.io/restore-from grants nothing.
	GrantsRefused map[types.NamespacedName]string
	// RecheckAfter, when not zero, is when a Secret that waits for its VM
	// to be stored (AdmissionGrace) is judged again.
	RecheckAfter time.Duration
}

// AdmissionGrace is how long a credential Secret that no VM controls may
// name a VirtualMachine that does not exist before it is refused. The
// webhook writes a VM's Secret while it admits the VM, before the API
// server stores the VM, so for a moment (longer on a busy cluster, and
// longer again in a cache) every new VM's Secret names a VM that does not
// exist yet: refusing it then would be a false alarm on every creation.
// A forged Secret gains nothing from the wait: no user is written for it.
const AdmissionGrace = 15 * time.Second

// UserInputs is everything CollectUsers decides from.
type UserInputs struct {
	// Server is the BSLS whose users are collected.
	Server types.NamespacedName
	// Secrets are the Secrets labelled as credential Secrets for Server.
	Secrets []corev1.Secret
	// VMs are the VirtualMachines (metadata) the Secrets are labelled for,
	// by namespace and name; a VM that does not exist is absent.
	VMs map[types.NamespacedName]*metav1.PartialObjectMetadata
	// Allowed is whether a namespace's VMs may use Server.
	Allowed func(namespace string) bool
	// HashOf is a Secret's hash of its current password; nil until the
	// controller has hashed it.
	HashOf func(*corev1.Secret) *identity.Hash
	// Now is the time the Secrets' ages are judged at (AdmissionGrace).
	Now time.Time
}

// CollectUsers decides the users of a BSLS from the per-VM credential
// Secrets labelled for it. Identity comes from facts, never from data
// (docs/design.md, decision 10): a Secret's user is <vm>@<namespace> of the
// VirtualMachine that controls it, and it is provisioned only when the
// Secret is named for that VM (vmsecret.Name), the VM exists in the
// Secret's namespace with the UID of the Secret's controller reference, the
// VM's guestbackup.io/server annotation names this server, the namespace
// may use it, and the password is hashed. Since a Secret can name no
// identity but that of its own VM, no Secret can claim another's user.
// The username key is the guest's: a Secret whose key says another user
// is refused, so that its guest's failed logins have a visible cause.
func CollectUsers(in UserInputs) UserSet {
	set := UserSet{Refused: map[string]string{}, GrantsRefused: map[types.NamespacedName]string{}}
	for i := range set.Shards {
		set.Shards[i] = map[string]identity.Hash{}
	}
	for i := range in.Secrets {
		s := &in.Secrets[i]
		key := s.Namespace + "/" + s.Name
		username, pending, refusal := identityOf(in, s)
		if wait := admissionWait(in, s); refusal != "" && wait > 0 {
			// Its VM may be in admission: judged again once the grace ends.
			refusal, pending = "", true
			if set.RecheckAfter == 0 || wait < set.RecheckAfter {
				set.RecheckAfter = wait
			}
		}
		switch {
		case refusal != "":
			set.Refused[key] = refusal
			continue
		case pending:
			set.Pending = append(set.Pending, key)
			continue
		}
		h := in.HashOf(s)
		if h == nil {
			set.Pending = append(set.Pending, key)
			continue
		}
		set.Shards[userset.ShardOf(username)][username] = *h
		set.Count++
		vm := types.NamespacedName{Namespace: s.Namespace, Name: vmsecret.VM(s)}
		// The rule the webhook admits a GuestRestore from another VM by.
		switch g, refusal := userset.RestoreFrom(vm.Name, vm.Namespace, in.VMs[vm].Annotations); {
		case refusal != "":
			set.GrantsRefused[vm] = refusal
		case g != nil:
			set.Grants[userset.ShardOf(username)] = append(set.Grants[userset.ShardOf(username)], *g)
		}
	}
	slices.Sort(set.Pending)
	return set
}

// admissionWait is how much of AdmissionGrace is left to Secret s, whose
// VM may not be stored yet: zero unless no VM controls s, its VM does not
// exist and s is younger than the grace.
func admissionWait(in UserInputs, s *corev1.Secret) time.Duration {
	vm := types.NamespacedName{Namespace: s.Namespace, Name: vmsecret.VM(s)}
	if metav1.GetControllerOf(s) != nil || in.VMs[vm] != nil || s.CreationTimestamp.IsZero() {
		return 0
	}
	return max(AdmissionGrace-in.Now.Sub(s.CreationTimestamp.Time), 0)
}

// identityOf checks the facts about one credential Secret: its user, or
// that it waits for its VM to adopt it, or why it is refused.
func identityOf(in UserInputs, s *corev1.Secret) (username string, pending bool, refusal string) {
	vm := vmsecret.VM(s)
	if vm == "" {
		return "", false, fmt.Sprintf("it has no label %s naming its VirtualMachine", vmsecret.LabelVM)
	}
	if !vmsecret.IsNamedFor(s) {
		return "", false, fmt.Sprintf("its label %s=%s names VirtualMachine %s, whose credential Secret can only be %s", vmsecret.LabelVM, vm, vm, vmsecret.Name(vm))
	}
	if !in.Allowed(s.Namespace) {
		return "", false, fmt.Sprintf("namespace %s is not selected by spec.access.namespaceSelector", s.Namespace)
	}
	username = vmsecret.Identity(s)
	if err := identity.ValidateUsername(username); err != nil {
		return "", false, fmt.Sprintf("VirtualMachine %s/%s has no valid Kopia identity: %v", s.Namespace, vm, err)
	}
	v := in.VMs[types.NamespacedName{Namespace: s.Namespace, Name: vm}]
	if v == nil {
		return "", false, fmt.Sprintf("VirtualMachine %s/%s does not exist: a user is provisioned only for an existing VM that names this server", s.Namespace, vm)
	}
	if want := v.Annotations[v1alpha1.AnnotationServer]; want != in.Server.String() {
		if want == "" {
			return "", false, fmt.Sprintf("VirtualMachine %s/%s has no annotation %s", s.Namespace, vm, v1alpha1.AnnotationServer)
		}
		return "", false, fmt.Sprintf("VirtualMachine %s/%s names server %s in annotation %s, not this one", s.Namespace, vm, want, v1alpha1.AnnotationServer)
	}
	if c := vmsecret.ForeignController(s, vm); c != nil {
		return "", false, fmt.Sprintf("it is controlled by %s %s, not by VirtualMachine %s", c.Kind, c.Name, vm)
	}
	if got := vmsecret.GuestUsername(s); got != "" && got != username {
		return "", false, fmt.Sprintf("its key %s says %q, but its VirtualMachine's identity is %s: the key is guestbackup's, not for editing; admit the VM again (any change to it) and the webhook rewrites it", vmsecret.KeyUsername, got, username)
	}
	if !vmsecret.ControlledBy(s, vm, v.UID) {
		// The webhook writes the Secret before the API server stores the
		// VM; the VM reconciler adopts it once the password is hashed (or
		// again for a VM created anew under the same name).
		return "", true, ""
	}
	return username, false, ""
}
