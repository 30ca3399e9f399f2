// Package vmsecret owns the per-VM credential Secret contract: its name,
// every label, annotation and key, who writes each, and whose Secret it is.
// Every reader (the webhook, the controller's reconcilers, the audit, the
// test bed) goes through it, so the contract is written down once.
//
// The Secret of VirtualMachine <vm> is <vm>-guestbackup, in the VM's
// namespace. Who writes what:
//
//   - The webhook (pkg/mutate), at the VM's admission: the name, type,
//     the labels LabelManagedBy, LabelVM, LabelServerNamespace and
//     LabelServerName; the keys username, password and generation; the
//     payload (key userdata in cloud-init mode, the bootstrap's files,
//     install.sh among them, in disk mode); annotations issued-at,
//     rendered-endpoint and rendered-ca-sha256 and, at a VM's creation,
//     issued-event.
//   - The controller's Hasher (pkg/credentials): the keys passwordHash and
//     passwordHashGeneration, and previousPasswordHash and
//     previousPasswordHashGeneration during a rotation.
//   - The controller's VM reconciler (pkg/credentials): the ownerReference
//     that makes the VM the Secret's controller (OwnerReference), the
//     announced-* annotations, and the removal of issued-event once it
//     recorded that Event.
//   - The controller's bootstrap reconciler (pkg/credentials): the
//     payload again, with the same credentials and placement, and the
//     rendered-* annotations, when the VM's server publishes another
//     endpoint or CA than the payload was rendered with.
//   - The controller's audit (pkg/audit): the last-snapshot,
//     backup-stale and client-report annotations.
//
// The payload is rendered by Render alone, so that the webhook and the
// bootstrap reconciler write the same bytes for the same input; the VM's
// status annotation (ParseStatus) records how it was placed, and
// SecretsRead says which Secrets a VM's volume reads, so whether the VM
// still reads its own.
//
// Identity comes from facts, never from data (docs/design.md, decision 10): the
// Kopia user of a Secret is Username(<vm>, <namespace>) of the VM that
// controls it, never its username key, which is there for the guest only.
// The constants of the API (label names, key names) stay in api/v1alpha1,
// where admins and guests read them; this package names them for Go.
package vmsecret

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// Labels of the Secret, all written by the webhook.
const (
	// LabelManagedBy=ManagedByValue marks the Secret as guestbackup's.
	LabelManagedBy = v1alpha1.LabelManagedBy
	// ManagedByValue is LabelManagedBy's value on guestbackup's objects.
	ManagedByValue = v1alpha1.ManagedByValue
	// LabelVM names the VM the Secret is for.
	LabelVM = v1alpha1.LabelVM
	// LabelServerNamespace and LabelServerName name the BSLS the VM's user
	// lives on.
	LabelServerNamespace = v1alpha1.LabelServerNamespace
	LabelServerName      = v1alpha1.LabelServerName
)

// Keys of the Secret.
const (
	// KeyUsername (webhook) is the VM's Kopia identity as its guest uses
	// it. Nothing on the controller's side trusts it: see Username.
	KeyUsername = v1alpha1.SecretKeyUsername
	// KeyPassword (webhook) is the VM's Kopia password.
	KeyPassword = v1alpha1.SecretKeyPassword
	// KeyGeneration (webhook) is bumped by every new password.
	KeyGeneration = v1alpha1.SecretKeyGeneration
	// KeyPasswordHash (Hasher) is KeyPassword hashed as Kopia stores it.
	KeyPasswordHash = v1alpha1.SecretKeyPasswordHash
	// KeyPasswordHashGeneration (Hasher) is the generation KeyPasswordHash
	// was computed for.
	KeyPasswordHashGeneration = v1alpha1.SecretKeyPasswordHashGeneration
	// KeyPreviousPasswordHash and KeyPreviousPasswordHashGeneration
	// (Hasher) are the hash of the generation before the current one while
	// the server still accepts it: a rotation reaches the guest only when
	// it starts again, and until then its guest knows the previous password
	// alone (see credentials.Hasher).
	KeyPreviousPasswordHash           = "previousPasswordHash"
	KeyPreviousPasswordHashGeneration = "previousPasswordHashGeneration"
	// KeyPreviousPasswordHashServer and KeyPreviousPasswordHashSince
	// (Hasher) are the server the previous hash was provisioned on and when
	// it stopped being current (see Previous).
	KeyPreviousPasswordHashServer = "previousPasswordHashServer"
	KeyPreviousPasswordHashSince  = "previousPasswordHashSince"
	// KeyUserData (webhook) is the cloud-init user-data KubeVirt reads.
	KeyUserData = v1alpha1.SecretKeyUserData
	// KeyInstall (webhook) is the disk-mode installer.
	KeyInstall = v1alpha1.SecretKeyInstall
)

// Annotations of the Secret.
const (
	// AnnotationIssuedAt (webhook) is when the current credentials were
	// issued (RFC 3339): provisioning is measured from it.
	AnnotationIssuedAt = v1alpha1.AnnotationIssuedAt
	// AnnotationIssuedEvent (webhook) is the message of the
	// CredentialsIssued Event of credentials issued at a VM's creation,
	// when the VM has no UID yet: an Event without one is never shown by
	// kubectl describe, so the VM reconciler records it once the VM
	// exists, and removes the annotation.
	AnnotationIssuedEvent = v1alpha1.AnnotationPrefix + "issued-event"
	// AnnotationAnnouncedGeneration and AnnotationAnnouncedServer (VM
	// reconciler) are the generation whose provisioning was last announced
	// with an Event on the VM, and the BSLS (<namespace>/<name>) it was
	// provisioned on. Kept on the Secret, not in memory, so that a resync
	// or a restart never announces a generation twice; the webhook keeps
	// them when it rewrites the Secret.
	AnnotationAnnouncedGeneration = v1alpha1.AnnotationPrefix + "announced-generation"
	AnnotationAnnouncedServer     = v1alpha1.AnnotationPrefix + "announced-server"
	// AnnotationLastSnapshot and AnnotationBackupStale (audit) are what the
	// audit last announced about the guest's snapshots.
	AnnotationLastSnapshot = v1alpha1.AnnotationPrefix + "last-snapshot"
	AnnotationBackupStale  = v1alpha1.AnnotationPrefix + "backup-stale"
	// AnnotationNotConnected (audit) is the UID of the VM's instance the
	// audit announced GuestNotConnected for: one warning per instance.
	AnnotationNotConnected = v1alpha1.AnnotationPrefix + "not-connected"
	// AnnotationClientReport (audit) is the guest's report about its kopia
	// client last announced with an Event (kind@time).
	AnnotationClientReport = v1alpha1.AnnotationPrefix + "client-report"
	// AnnotationRenderedEndpoint and AnnotationRenderedCA (webhook,
	// bootstrap reconciler) are the server endpoint and the SHA-256 (hex)
	// of the CA PEM the payload was rendered with: the controller renders
	// the payload again when the server publishes others. Neither is
	// secret.
	AnnotationRenderedEndpoint = v1alpha1.AnnotationPrefix + "rendered-endpoint"
	AnnotationRenderedCA       = v1alpha1.AnnotationPrefix + "rendered-ca-sha256"
	// AnnotationRenderedCAAt (webhook, bootstrap reconciler) is when the
	// payload was first rendered with the CA it carries (RFC 3339): a guest
	// whose virt-launcher started after it trusts that CA, one started
	// before does not yet. A rotation of the server's CA waits for those.
	AnnotationRenderedCAAt = v1alpha1.AnnotationPrefix + "rendered-ca-at"
	// AnnotationRenderedClient (webhook, bootstrap reconciler) is the
	// clientdist.Digest of the kopia client the payload carries; absent
	// when it carries none.
	AnnotationRenderedClient = v1alpha1.AnnotationPrefix + "rendered-client"
)

// vmKind is what an ownerReference to a KubeVirt VirtualMachine says.
var vmKind = kubevirtv1.VirtualMachineGroupVersionKind

// Name is the Secret of VM vm, in the VM's namespace.
func Name(vm string) string { return v1alpha1.CredentialSecretName(vm) }

// ValidateVMName says why a VM named vm cannot have a credential Secret:
// the Secret is named Name(vm) and labelled LabelVM=vm, so vm must be a
// valid label value (at most 63 characters) and Name(vm) a valid Secret
// name (a DNS subdomain of at most 253).
func ValidateVMName(vm string) error {
	if errs := validation.IsValidLabelValue(vm); len(errs) > 0 {
		return fmt.Errorf("its name (%d characters) cannot label its credential Secret (%s=<name>): %s", len(vm), LabelVM, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(Name(vm)); len(errs) > 0 {
		return fmt.Errorf("its credential Secret cannot be named %s: %s", Name(vm), strings.Join(errs, "; "))
	}
	return nil
}

// ParseServerRef parses the value of a VM's guestbackup.io/server
// annotation: <namespace>/<name> of a BackupStorageLocationServer.
func ParseServerRef(value string) (types.NamespacedName, error) {
	namespace, name, ok := strings.Cut(value, "/")
	if !ok || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("annotation %s=%q: want <namespace>/<name> of a BackupStorageLocationServer", v1alpha1.AnnotationServer, value)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return types.NamespacedName{}, fmt.Errorf("annotation %s=%q: namespace %q: %s", v1alpha1.AnnotationServer, value, namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return types.NamespacedName{}, fmt.Errorf("annotation %s=%q: name %q: %s", v1alpha1.AnnotationServer, value, name, strings.Join(errs, "; "))
	}
	return types.NamespacedName{Namespace: namespace, Name: name}, nil
}

// Selector matches every credential Secret.
func Selector() labels.Selector {
	managed, _ := labels.NewRequirement(LabelManagedBy, selection.Equals, []string{ManagedByValue})
	vm, _ := labels.NewRequirement(LabelVM, selection.Exists, nil)
	return labels.NewSelector().Add(*managed, *vm)
}

// ServerLabels select the credential Secrets labelled for server.
func ServerLabels(server types.NamespacedName) map[string]string {
	return map[string]string{LabelManagedBy: ManagedByValue, LabelServerNamespace: server.Namespace, LabelServerName: server.Name}
}

// Labels are the labels the webhook writes on VM vm's Secret for server.
func Labels(vm string, server types.NamespacedName) map[string]string {
	l := ServerLabels(server)
	l[LabelVM] = vm
	return l
}

// IsManaged is whether s is labelled as guestbackup's.
func IsManaged(s *corev1.Secret) bool { return s.Labels[LabelManagedBy] == ManagedByValue }

// VM is the VM s is labelled for; "" for none.
func VM(s *corev1.Secret) string { return s.Labels[LabelVM] }

// IsNamedFor is whether s is named and labelled as the Secret of its
// labelled VM.
func IsNamedFor(s *corev1.Secret) bool { return VM(s) != "" && s.Name == Name(VM(s)) }

// Server is the BSLS s is labelled for.
func Server(s *corev1.Secret) types.NamespacedName {
	return types.NamespacedName{Namespace: s.Labels[LabelServerNamespace], Name: s.Labels[LabelServerName]}
}

// Identity is the Kopia user of s as facts say, from its namespace and the
// VM it is labelled for; "" when it names no VM. Whether that VM exists
// and controls s is for the caller to check (see ControlledBy).
func Identity(s *corev1.Secret) string {
	if VM(s) == "" {
		return ""
	}
	return identity.OfVM(VM(s), s.Namespace)
}

// GuestUsername is the username key: what the guest connects as. Never
// an identity on the controller's side.
func GuestUsername(s *corev1.Secret) string { return data(s, KeyUsername) }

// Password is the VM's Kopia password.
func Password(s *corev1.Secret) string { return data(s, KeyPassword) }

// Generation is the credentials generation, as written; "" for none.
func Generation(s *corev1.Secret) string { return data(s, KeyGeneration) }

// GenerationNumber is Generation as a number, false when it is not one of
// at least 1.
func GenerationNumber(s *corev1.Secret) (int64, bool) {
	g, err := strconv.ParseInt(Generation(s), 10, 64)
	return g, err == nil && g >= 1
}

// PasswordHash is the stored hash of the current generation's password, in
// Kopia's text form; false when there is none for that generation.
func PasswordHash(s *corev1.Secret) (string, bool) {
	if data(s, KeyPasswordHashGeneration) != Generation(s) || data(s, KeyPasswordHash) == "" {
		return "", false
	}
	return data(s, KeyPasswordHash), true
}

// StaleHash is the hash the Secret holds for an earlier generation than its
// current one, with that generation; false when there is none: a rotation
// the Hasher has not hashed yet leaves the previous hash in place.
func StaleHash(s *corev1.Secret) (hash, generation string, ok bool) {
	g := data(s, KeyPasswordHashGeneration)
	if g == "" || g == Generation(s) || data(s, KeyPasswordHash) == "" {
		return "", "", false
	}
	return data(s, KeyPasswordHash), g, true
}

// Previous is the hash of a generation before the current one that the
// server keeps accepting while a rotation waits for the guest to restart.
type Previous struct {
	// Hash is the previous generation's password hash, in Kopia's text form.
	Hash string
	// Generation is the generation Hash was computed for.
	Generation string
	// Server is the BSLS (<namespace>/<name>) the hash was provisioned on:
	// a VM that moves to another server takes no password with it.
	Server string
	// Since is when the hash stopped being the current one: the first
	// rotation after it. A second rotation while it is kept never moves
	// it, so the grace period ends at a fixed time.
	Since time.Time
}

// PreviousHash is the previous generation's hash the server still accepts;
// false when there is none.
func PreviousHash(s *corev1.Secret) (Previous, bool) {
	p := Previous{
		Hash:       data(s, KeyPreviousPasswordHash),
		Generation: data(s, KeyPreviousPasswordHashGeneration),
		Server:     data(s, KeyPreviousPasswordHashServer),
	}
	if t, err := time.Parse(time.RFC3339Nano, data(s, KeyPreviousPasswordHashSince)); err == nil {
		p.Since = t
	}
	return p, p.Hash != ""
}

// SetPreviousHash records p as the previous generation's hash that the
// server keeps accepting; nil removes it.
func SetPreviousHash(s *corev1.Secret, p *Previous) {
	keys := []string{KeyPreviousPasswordHash, KeyPreviousPasswordHashGeneration, KeyPreviousPasswordHashServer, KeyPreviousPasswordHashSince}
	if p == nil || p.Hash == "" {
		for _, k := range keys {
			delete(s.Data, k)
		}
		return
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	for k, v := range map[string]string{
		KeyPreviousPasswordHash:           p.Hash,
		KeyPreviousPasswordHashGeneration: p.Generation,
		KeyPreviousPasswordHashServer:     p.Server,
		KeyPreviousPasswordHashSince:      p.Since.UTC().Format(time.RFC3339Nano),
	} {
		s.Data[k] = []byte(v)
	}
}

// IsControllerKey is whether key is written by the controller, never by
// the webhook, which keeps it when it rewrites the Secret.
func IsControllerKey(key string) bool {
	switch key {
	case KeyPasswordHash, KeyPasswordHashGeneration, KeyPreviousPasswordHash, KeyPreviousPasswordHashGeneration, KeyPreviousPasswordHashServer, KeyPreviousPasswordHashSince:
		return true
	}
	return false
}

// IsPayloadKey is whether key is the payload's (the bootstrap rendered for
// the guest: user-data, or a disk's files): neither the credentials the
// webhook writes beside it nor a key of the controller's. A new rendering
// replaces every payload key, so that a mode change leaves none of the
// other mode's files.
func IsPayloadKey(key string) bool {
	switch key {
	case KeyUsername, KeyPassword, KeyGeneration:
		return false
	}
	return !IsControllerKey(key)
}

// CASum is the SHA-256 (hex) of a CA PEM, as AnnotationRenderedCA records it.
func CASum(ca []byte) string {
	sum := sha256.Sum256(ca)
	return hex.EncodeToString(sum[:])
}

// Rendered is the endpoint and CASum of the CA s's payload was rendered
// with; "" for what it does not record (a Secret written before it did).
func Rendered(s *corev1.Secret) (endpoint, caSum string) {
	return s.Annotations[AnnotationRenderedEndpoint], s.Annotations[AnnotationRenderedCA]
}

// SetRendered records that s's payload was rendered with endpoint and ca
// at time at; when it first carried ca stays as it was while ca does not
// change.
func SetRendered(s *corev1.Secret, endpoint string, ca []byte, at time.Time) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	sum := CASum(ca)
	if _, since := RenderedCAAt(s); s.Annotations[AnnotationRenderedCA] != sum || !since {
		// Without a record (a Secret an earlier release wrote), now: a
		// guest started earlier counts as one that may not trust it.
		s.Annotations[AnnotationRenderedCAAt] = at.UTC().Format(time.RFC3339)
	}
	s.Annotations[AnnotationRenderedEndpoint] = endpoint
	s.Annotations[AnnotationRenderedCA] = sum
}

// RenderedCAAt is when s's payload was first rendered with the CA it
// carries; false when s does not record it.
func RenderedCAAt(s *corev1.Secret) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, s.Annotations[AnnotationRenderedCAAt])
	return t, err == nil
}

// RenderedClient is the digest of the client s's payload carries; "" for
// none.
func RenderedClient(s *corev1.Secret) string { return s.Annotations[AnnotationRenderedClient] }

// SetRenderedClient records the digest of the client s's payload carries
// ("" for none).
func SetRenderedClient(s *corev1.Secret, digest string) {
	if digest == "" {
		delete(s.Annotations, AnnotationRenderedClient)
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[AnnotationRenderedClient] = digest
}

// SetPasswordHash records hash as the current generation's.
func SetPasswordHash(s *corev1.Secret, hash string) {
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[KeyPasswordHash] = []byte(hash)
	s.Data[KeyPasswordHashGeneration] = []byte(Generation(s))
}

// IssuedAt is when the current credentials were issued; the Secret's
// creation when it does not say.
func IssuedAt(s *corev1.Secret) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, s.Annotations[AnnotationIssuedAt]); err == nil {
		return t
	}
	return s.CreationTimestamp.Time
}

// IssuedEvent is the message of the CredentialsIssued Event that waits for
// s's VM to exist, "" for none.
func IssuedEvent(s *corev1.Secret) string { return s.Annotations[AnnotationIssuedEvent] }

// Announced is the provisioning last announced for s: the BSLS
// (<namespace>/<name>) and generation, "" for none.
func Announced(s *corev1.Secret) (server, generation string) {
	return s.Annotations[AnnotationAnnouncedServer], s.Annotations[AnnotationAnnouncedGeneration]
}

// SetAnnounced records the announcement of generation on server.
func SetAnnounced(s *corev1.Secret, server, generation string) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[AnnotationAnnouncedGeneration] = generation
	s.Annotations[AnnotationAnnouncedServer] = server
}

// OwnerReference is the reference the controller adopts a Secret with: the
// VM is its controller, so that the Secret names exactly one VM and the
// server provisions the user of that VM only. It does not block the VM's
// deletion (the VM reconciler deletes the Secret).
func OwnerReference(vm string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: vmKind.GroupVersion().String(), Kind: vmKind.Kind,
		Name: vm, UID: uid,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false),
	}
}

// IsVMReference is whether ref names a KubeVirt VirtualMachine.
func IsVMReference(ref metav1.OwnerReference) bool {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == vmKind.Group && ref.Kind == vmKind.Kind
}

// Adopted is whether any VirtualMachine ever adopted s.
func Adopted(s *corev1.Secret) bool { return slices.ContainsFunc(s.OwnerReferences, IsVMReference) }

// Controller is the reference to s's controller, nil when it has none.
func Controller(s *corev1.Secret) *metav1.OwnerReference {
	return metav1.GetControllerOfNoCopy(s)
}

// ControlledBy is whether VM vm with uid is s's controller.
func ControlledBy(s *corev1.Secret, vm string, uid types.UID) bool {
	c := Controller(s)
	return c != nil && IsVMReference(*c) && c.Name == vm && uid != "" && c.UID == uid
}

// ForeignController is s's controller when it is anything but a
// VirtualMachine named vm (of any UID: a VM deleted and created again under
// that name is the same identity), nil otherwise.
func ForeignController(s *corev1.Secret, vm string) *metav1.OwnerReference {
	if c := Controller(s); c != nil && !(IsVMReference(*c) && c.Name == vm) {
		return c
	}
	return nil
}

// NotOurs says why s, an existing Secret named Name(vm), is not
// guestbackup's Secret for VM vm, "" when it is: it must be labelled as
// guestbackup's and for vm, and have no controller but a VM of that name.
// A controller with vm's name and another UID is a previous VM of that
// name (deleted and created again): the same identity, which the
// controller adopts for the new VM.
func NotOurs(s *corev1.Secret, vm string) string {
	switch c := ForeignController(s, vm); {
	case !IsManaged(s):
		return fmt.Sprintf("it is not labelled %s=%s", LabelManagedBy, ManagedByValue)
	case VM(s) != vm:
		return fmt.Sprintf("its label %s is %q, not %q", LabelVM, VM(s), vm)
	case c != nil:
		return fmt.Sprintf("it is controlled by %s %s", c.Kind, c.Name)
	}
	return ""
}

func data(s *corev1.Secret, key string) string {
	if s == nil {
		return ""
	}
	return string(s.Data[key])
}
