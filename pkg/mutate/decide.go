package mutate

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// What the webhook adds to a VM's template.
const (
	// CloudInitVolume is the NoCloud volume (and disk) added to a VM that
	// has no cloud-init of its own.
	CloudInitVolume = "guestbackup-cloudinit"
	// DiskVolume is the secret volume (and disk) of disk mode.
	DiskVolume = "guestbackup"
	// DiskSerial identifies the disk in the guest
	// (/dev/disk/by-id/virtio-guestbackup); virtio shows 20 characters.
	DiskSerial = "guestbackup"
	// DiskLabel is the disk's filesystem label (/dev/disk/by-label/guestbackup).
	DiskLabel = "guestbackup"
)

// Event reasons the webhook records on a VM.
const (
	// ReasonCredentialsIssued: the VM got new Kopia credentials. On
	// CREATE the Event waits in the Secret for the VM's UID
	// (vmsecret.AnnotationIssuedEvent): the controller records it.
	ReasonCredentialsIssued = vmevent.ReasonCredentialsIssued
	// ReasonInjectionRefused: the VM was denied; the message says why.
	ReasonInjectionRefused = "InjectionRefused"
	// ReasonInjectionNotUpdated: an injected VM's guestbackup annotations
	// changed while its server cannot render a bootstrap; the VM is
	// admitted as it is, and the message says when the change applies.
	ReasonInjectionNotUpdated = "InjectionNotUpdated"
)

// SecretName is the per-VM credential Secret of a VM (vmsecret.Name).
func SecretName(vmName string) string { return vmsecret.Name(vmName) }

// Server is what the webhook found about the BSLS a VM names.
type Server struct {
	// BSLS is nil when it does not exist.
	BSLS *v1alpha1.BackupStorageLocationServer
	// NamespaceAllowed is whether the VM's namespace may use it.
	NamespaceAllowed bool
}

// Input is everything Decide looks at. The handler gathers it; Decide has
// no side effects.
type Input struct {
	// Object is the VirtualMachine as admitted, raw: patches are computed
	// against it, so fields guestbackup's types do not know are never
	// touched.
	Object []byte
	// OldObject is the VirtualMachine as stored before an UPDATE; nil on
	// CREATE. It tells what the webhook injected when an update removed
	// the status annotation, and which of guestbackup's annotations changed.
	OldObject []byte
	// Namespace is the request's; an object being created may have none.
	Namespace string
	// Server is the BSLS the VM's guestbackup.io/server annotation names.
	Server Server
	// Secret is the VM's existing credential Secret, nil when none.
	Secret *corev1.Secret
	// Sources are the credential Secrets, by name, of other VMs that this
	// VM's status annotation names or its volumes read (CopySources): a
	// copy of an injected VM (a VirtualMachineClone copies annotations, as
	// does get -o yaml, rename, apply) reads its source's. They are only
	// read: the owner's own user-data, when it was merged, is there.
	Sources map[string]*corev1.Secret
	// AlreadyExists is set on CREATE when a VirtualMachine of this name
	// exists: the API server refuses the request after admission, so
	// admission must change nothing, least of all that VM's credentials.
	AlreadyExists bool
	// read is Object as readAdmitted read it, when the caller read it
	// already; nil: Decide reads it.
	read *admittedVM
	// NewPassword returns a fresh random password; called only when new
	// credentials are issued.
	NewPassword func() (string, error)
	// Now is when the admission happens, recorded on issued credentials.
	Now time.Time
}

// Decision is what admission does to a VM.
type Decision struct {
	// Denied, when not empty, is why the VM is refused; nothing else applies.
	Denied string
	// Patch is the minimal JSON patch of the VM; empty when nothing changes.
	Patch []jsonpatch.JsonPatchOperation
	// Secret is the per-VM Secret as it must be stored; nil when the
	// existing one is right (or, on opt-out, the controller removes it).
	Secret *corev1.Secret
	// Events to record on the VM.
	Events []vmevent.Event
	// Outcome names the decision for metrics: ignored, denied, issued,
	// rotated, updated, unchanged or removed.
	Outcome string
}

// Outcomes of Decide.
const (
	OutcomeIgnored   = "ignored"
	OutcomeDenied    = "denied"
	OutcomeIssued    = "issued"
	OutcomeRotated   = "rotated"
	OutcomeUpdated   = "updated"
	OutcomeUnchanged = "unchanged"
	OutcomeRemoved   = "removed"
)

func deny(format string, args ...any) Decision {
	msg := fmt.Sprintf(format, args...)
	return Decision{Denied: msg, Events: []vmevent.Event{vmevent.Warning(ReasonInjectionRefused, msg)}, Outcome: OutcomeDenied}
}

// Decide decides what to do with an admitted VM: deny it, inject the
// bootstrap, re-issue credentials, keep everything as it is, or remove
// what was injected when the VM opted out. Admitting its result again
// yields no patch. An error is an internal failure, not a denial.
//
// It never stands in a VM's life: a VM being deleted is admitted
// unchanged, and a VM that was given its bootstrap is never denied for its
// server's state. Nothing of the owner's is lost: what was injected is read
// from the stored object (OldObject) when an update removed the status
// annotation. A copy of an injected VM is given an identity of its own
// (adoptCopy).
func Decide(in Input) (Decision, error) {
	r := in.read
	if r == nil {
		var err error
		if r, err = readAdmitted(in.Object); err != nil {
			return deny("guestbackup cannot read this VirtualMachine: %v", err), nil
		}
	}
	d, err := decideOn(r.vm, r.shape, in)
	if err != nil || len(d.Patch) == 0 {
		return d, err
	}
	if refusal := twiceRefusal(r.twice); refusal != "" {
		return deny("%s", refusal), nil
	}
	return d, nil
}

// decideOn is Decide on the VM as readAdmitted read it, of shape s. It
// never changes read: each step takes the VM it decides on and returns the
// one the next step sees (a copy's volumes repointed, adoptCopy).
func decideOn(read *kubevirtv1.VirtualMachine, s shape, in Input) (Decision, error) {
	vm := inNamespace(read, in.Namespace)
	if vm.DeletionTimestamp != nil {
		// Nothing guestbackup does may hold up a deletion, and a VM on
		// its way out gets no new credentials.
		return Decision{Outcome: OutcomeIgnored}, nil
	}
	if in.AlreadyExists {
		return deny("VirtualMachine %s/%s already exists: a CREATE cannot replace it, and guestbackup leaves its credentials as they are; change the existing VM instead", vm.Namespace, vm.Name), nil
	}
	pr, err := priorInjection(vm.Annotations, in.OldObject)
	if err != nil {
		return deny("%v", err), nil
	}
	value, optedIn := vm.Annotations[v1alpha1.AnnotationServer]
	if !optedIn {
		return notOptedIn(vm, pr, in.Secret), nil
	}
	return optedInDecision(vm, s, value, pr, in)
}

// inNamespace is vm in namespace when it names none (an object being
// created may not): a shallow copy, vm itself when it names one.
func inNamespace(vm *kubevirtv1.VirtualMachine, namespace string) *kubevirtv1.VirtualMachine {
	if vm.Namespace != "" {
		return vm
	}
	c := *vm
	c.Namespace = namespace
	return &c
}

// notOptedIn is the decision on a VM without the server annotation: left
// alone when nothing was injected, else what was injected removed
// (optOut), unless it is a copy whose own cloud-init is in its source's
// Secret.
func notOptedIn(vm *kubevirtv1.VirtualMachine, pr prior, secret *corev1.Secret) Decision {
	if !pr.known {
		return Decision{Outcome: OutcomeIgnored}
	}
	if pr.status.Secret != SecretName(vm.Name) && pr.status.MergedFrom != "" {
		// A copy that does not opt in: its own cloud-init is in its
		// source's Secret. Patching it into this VM's spec would hand
		// another VM's user-data to anyone who may create VMs (a dry
		// run leaves no trace), which is why it was moved into a
		// Secret: the owner decides instead.
		return deny("VirtualMachine %s/%s carries annotation %s of another VM's injection: its cloud-init is in Secret %s of that VM, which guestbackup gives back to that VM only; opt this copy in (annotation %s) so that it gets credentials and a Secret of its own, or remove annotation %s and give volume %s cloud-init of its own",
			vm.Namespace, vm.Name, v1alpha1.AnnotationStatus, pr.status.Secret, v1alpha1.AnnotationServer, v1alpha1.AnnotationStatus, pr.status.Volume)
	}
	return optOut(vm, pr, secret)
}

// optedInDecision is the decision on a VM whose server annotation is
// value: refused, admitted as it is while its server cannot serve
// (keepInjection), or injected, as a copy's own when it is one.
func optedInDecision(vm *kubevirtv1.VirtualMachine, s shape, value string, pr prior, in Input) (Decision, error) {
	o, refusal := readOptions(vm, value)
	if refusal != "" {
		return deny("%s", refusal), nil
	}
	if in.Secret != nil {
		// The webhook writes the Secret named after the VM: one that is
		// not guestbackup's for this VM is someone's data, never clobbered.
		if why := vmsecret.NotOurs(in.Secret, vm.Name); why != "" {
			return deny("Secret %s/%s already exists and is not guestbackup's credential Secret for VirtualMachine %s (%s): guestbackup keeps this VM's credentials in a Secret of that name and never overwrites another; rename or delete that Secret, or give the VM another name, or remove annotation %s",
				vm.Namespace, in.Secret.Name, vm.Name, why, v1alpha1.AnnotationServer), nil
		}
	}
	if vm.Spec.Template == nil {
		return deny("VirtualMachine %s/%s has no spec.template to inject into", vm.Namespace, vm.Name), nil
	}
	if in.Secret != nil {
		// in.Secret is ours for this VM (NotOurs above): it is evidence
		// the annotation is not.
		pr = pr.withOwnSecret(vm, in.Secret)
	}
	vm, pr, copyOps, refusal := adoptCopy(vm, pr, in.Sources)
	if refusal != "" {
		return deny("%s", refusal), nil
	}
	if pr.injectedFor(vm, o.server) {
		// The VM was given its bootstrap: its life (edits, start, stop,
		// a GitOps tool applying its manifest again) never waits on its
		// server's health. The Secret is rendered again only when the
		// server can render it.
		if !serves(in.Server) {
			return keepInjection(vm, o.server, pr, in), nil
		}
	} else if refusal := checkServer(vm, o.server, in.Server); refusal != "" {
		return deny("%s", refusal), nil
	}
	d, err := inject(vm, s, o, pr, in)
	if err != nil || d.Denied != "" {
		return d, err
	}
	if len(copyOps) > 0 {
		d.Patch = append(copyOps, d.Patch...)
		if d.Outcome == OutcomeUnchanged {
			d.Outcome = OutcomeUpdated
		}
	}
	return d, nil
}

// options are the VM's guestbackup annotations, parsed.
type options struct {
	server   types.NamespacedName
	user     string
	mode     string
	paths    []string
	schedule string
	rotate   string
}

func readOptions(vm *kubevirtv1.VirtualMachine, server string) (options, string) {
	var o options
	var err error
	if o.server, err = ParseServerRef(server); err != nil {
		return o, err.Error()
	}
	if o.user, err = Username(vm.Name, vm.Namespace); err != nil {
		return o, err.Error() + "; rename the VM, or remove annotation " + v1alpha1.AnnotationServer
	}
	o.mode = vm.Annotations[v1alpha1.AnnotationMode]
	if o.mode != "" && o.mode != v1alpha1.ModeCloudInit && o.mode != v1alpha1.ModeDisk {
		return o, fmt.Sprintf("annotation %s=%q: want %s or %s", v1alpha1.AnnotationMode, o.mode, v1alpha1.ModeCloudInit, v1alpha1.ModeDisk)
	}
	if o.paths, o.schedule, err = cloudinit.Schedule(vm.Annotations); err != nil {
		return o, err.Error()
	}
	o.rotate = vm.Annotations[v1alpha1.AnnotationRotate]
	return o, ""
}

// checkServer says why a VM cannot get a bootstrap from the server s
// (ref) now, "" when it can. A new bootstrap needs the server to exist, to
// admit the VM's namespace, and to have published the endpoint and the CA
// the guest trusts. Its aggregate Ready is not asked: it is False for a
// moment whenever any VM's user is being provisioned or a certificate
// renews, and neither stands in a new VM's way.
func checkServer(vm *kubevirtv1.VirtualMachine, ref types.NamespacedName, s Server) string {
	if s.BSLS == nil {
		return fmt.Sprintf("BackupStorageLocationServer %s named by annotation %s does not exist: ask your cluster admin for the right <namespace>/<name>", ref, v1alpha1.AnnotationServer)
	}
	if !s.NamespaceAllowed {
		return fmt.Sprintf("BackupStorageLocationServer %s does not admit VMs of namespace %s (its spec.access.namespaceSelector): ask its admin to admit it", ref, vm.Namespace)
	}
	if !serves(s) {
		return fmt.Sprintf("BackupStorageLocationServer %s has not published its endpoint and CA certificate yet (%s), and the guest needs both: see `kubectl describe bsls -n %s %s`, and retry once status.endpoint and status.tlsCA are set",
			ref, readiness(s.BSLS), ref.Namespace, ref.Name)
	}
	return ""
}

// serves is whether s can render a bootstrap: it exists and has published
// its endpoint and CA.
func serves(s Server) bool {
	return s.BSLS != nil && s.BSLS.Status.Endpoint != "" && s.BSLS.Status.TLSCA != ""
}

// readiness is the BSLS's Ready condition, in words.
func readiness(bsls *v1alpha1.BackupStorageLocationServer) string {
	ready := meta.FindStatusCondition(bsls.Status.Conditions, v1alpha1.ConditionReady)
	if ready == nil {
		return "it reports no status yet"
	}
	return fmt.Sprintf("Ready=%s %s: %s", ready.Status, ready.Reason, ready.Message)
}

// keepInjection admits a VM that was given its bootstrap, and whose
// server cannot render one now (deleted, or its endpoint or CA not
// published), as it is: its Secret stays, and only a status annotation an
// update removed is put back. What cannot apply now (changed guestbackup
// annotations, or the bootstrap's volume an update dropped) is said in a
// Warning, with when it will.
func keepInjection(vm *kubevirtv1.VirtualMachine, ref types.NamespacedName, pr prior, in Input) Decision {
	d := Decision{Outcome: OutcomeUnchanged}
	if !pr.written {
		op, err := statusOp(pr.status, false)
		if err != nil {
			return deny("guestbackup cannot write its status annotation: %v", err)
		}
		d.Patch, d.Outcome = []jsonpatch.JsonPatchOperation{op}, OutcomeUpdated
	}
	what := ""
	switch {
	case !stillInjected(&vm.Spec.Template.Spec, pr.status):
		what = fmt.Sprintf("the VM is admitted without the volume %s that reads its Secret %s, which this update removed; guestbackup adds it again", pr.status.Volume, pr.status.Secret)
	case optionsChanged(vm.Annotations, in.OldObject):
		what = fmt.Sprintf("the VM is admitted and its Secret %s kept as it was; the changed guestbackup.io annotations apply", pr.status.Secret)
	default:
		return d
	}
	why := fmt.Sprintf("has not published its endpoint and CA certificate (%s)", readinessOf(in.Server))
	if in.Server.BSLS == nil {
		why = "does not exist"
	}
	d.Events = append(d.Events, vmevent.Warning(ReasonInjectionNotUpdated, fmt.Sprintf(
		"BackupStorageLocationServer %s %s: %s when the VM is next admitted with a change to guestbackup.io annotations or its volumes while the server serves", ref, why, what)))
	return d
}

func readinessOf(s Server) string {
	if s.BSLS == nil {
		return "it does not exist"
	}
	return readiness(s.BSLS)
}

// optionsChanged is whether an update changed any guestbackup.io
// annotation but the status.
func optionsChanged(annotations map[string]string, oldObject []byte) bool {
	if oldObject == nil {
		return false
	}
	old := headOf(oldObject).Annotations
	for _, m := range []map[string]string{annotations, old} {
		for k := range m {
			if strings.HasPrefix(k, v1alpha1.AnnotationPrefix) && k != v1alpha1.AnnotationStatus && annotations[k] != old[k] {
				return true
			}
		}
	}
	return false
}

// headOf reads an object's metadata; an unreadable one has none.
func headOf(object []byte) metav1.ObjectMeta {
	var head struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	_ = json.Unmarshal(object, &head)
	return head.Metadata
}

// prior is what the webhook injected before this admission, as its status
// annotation says: the admitted object's, or, when an update removed it,
// the stored object's (so that removing it loses nothing of the owner's).
type prior struct {
	status v1alpha1.InjectionStatus
	// known: status holds what was injected.
	known bool
	// written: the admitted object carries the annotation.
	written bool
	// copied: status is another VM's, made this VM's (adoptCopy); source
	// is that VM's Secret, nil when it is gone.
	copied bool
	source *corev1.Secret
	// proven: something a tenant cannot write shows that the webhook
	// injected status: the stored object carries it (every write of it
	// passed the webhook), or the VM's own credential Secret, which
	// only guestbackup writes, names the same server. A status only the
	// admitted object carries is the tenant's word, and is never taken
	// as leave to skip the server's checks.
	proven bool
}

func priorInjection(annotations map[string]string, oldObject []byte) (prior, error) {
	st, ok, err := vmsecret.ParseStatus(annotations)
	if err != nil || ok {
		p := prior{status: st, known: ok, written: ok}
		if ok && oldObject != nil {
			stored, found := headOf(oldObject).Annotations[v1alpha1.AnnotationStatus]
			p.proven = found && stored == annotations[v1alpha1.AnnotationStatus]
		}
		return p, err
	}
	if oldObject != nil {
		if st, ok, err := vmsecret.ParseStatus(headOf(oldObject).Annotations); err == nil && ok {
			return prior{status: st, known: true, proven: true}, nil
		}
	}
	return prior{}, nil
}

// withOwnSecret is p in the light of the VM's own credential Secret
// (ours for vm, which the caller checked). A status that names the server
// the Secret was written for is proven. A VM with no status whose
// template reads that Secret was injected before and has lost the record
// of it: deleted and created again from a manifest that kept the
// volume, while the Secret outlived it (kubectl delete --cascade=orphan,
// the garbage collector's window). What was injected is then what the
// volume and the Secret show, so that the owner's own user-data the
// Secret holds is carried over, never rendered away.
func (p prior) withOwnSecret(vm *kubevirtv1.VirtualMachine, secret *corev1.Secret) prior {
	server := vmsecret.Server(secret).String()
	if p.known {
		p.proven = p.proven || p.status.Server == server
		return p
	}
	own := SecretName(vm.Name)
	spec := &vm.Spec.Template.Spec
	for _, v := range spec.Volumes {
		if bootstrapSecret(v) == own {
			st := injectedThrough(spec, v, secret)
			// The credentials are the Secret's: the rotation the VM asks
			// for is the one they were issued under, not a new one.
			st.Secret, st.Rotate = own, vm.Annotations[v1alpha1.AnnotationRotate]
			return prior{status: st, known: true, proven: true}
		}
	}
	return p
}

// injectedFor is whether the status says, provably, that vm was given its
// bootstrap on server; the template may have lost it since (an update
// that dropped the volume).
func (p prior) injectedFor(vm *kubevirtv1.VirtualMachine, server types.NamespacedName) bool {
	return p.known && p.proven && !p.copied && p.status.Server == server.String() && p.status.Secret == SecretName(vm.Name)
}

// injectedThrough is what was injected, as far as volume v of spec (which
// reads credential Secret src) and src show, when no status records it:
// disk mode for a secret volume; the owner's own cloud-init merged when
// src's user-data carries a part of the owner's; else guestbackup's own
// cloud-init volume (and its disk, when there is one of the name). The
// field the owner's user-data was merged from is recorded nowhere else,
// so it is taken as userData. The Secret field is left to the caller.
func injectedThrough(spec *kubevirtv1.VirtualMachineInstanceSpec, v kubevirtv1.Volume, src *corev1.Secret) v1alpha1.InjectionStatus {
	st := v1alpha1.InjectionStatus{Mode: v1alpha1.ModeCloudInit, Server: vmsecret.Server(src).String(), Volume: v.Name}
	_, err := cloudinit.UserPart(secretData(src, vmsecret.KeyUserData))
	switch {
	case v.Secret != nil:
		st.Mode, st.Disk = v1alpha1.ModeDisk, v.Name
	case err == nil:
		st.MergedFrom = "userData"
	case diskIndex(spec, v.Name) >= 0:
		st.Disk = v.Name
	}
	return st
}

// CopySources names the Secrets, other than its own, that the VM object
// may have been copied with: the one its status annotation names and those
// its cloud-init and secret volumes read, when named as a credential
// Secret. The handler reads them for Decide (Input.Sources).
func CopySources(object []byte) []string {
	r, err := readAdmitted(object)
	if err != nil {
		return nil
	}
	return copySources(r.vm)
}

// copySources is CopySources of a VM as readAdmitted read it.
func copySources(vm *kubevirtv1.VirtualMachine) []string {
	own := SecretName(vm.Name)
	var names []string
	add := func(name string) {
		if name != own && strings.HasSuffix(name, SecretName("")) && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	if st, ok, err := vmsecret.ParseStatus(vm.Annotations); err == nil && ok {
		add(st.Secret)
	}
	if vm.Spec.Template != nil {
		for _, v := range vm.Spec.Template.Spec.Volumes {
			add(bootstrapSecret(v))
		}
	}
	return names
}

// bootstrapSecret is the Secret volume v reads a bootstrap from in one of
// the two shapes guestbackup places it (place): a cloudInitNoCloud
// volume's user-data, or a secret disk; "" for none. It is the one
// reference a copy's volume is repointed by (adoptCopy) and the one a VM's
// injection is recovered from (withOwnSecret): any other reference (network
// data, a config drive, sysprep) is the owner's, and guestbackup never
// rewrites it. Which Secrets a volume reads at all is vmsecret.SecretsRead.
func bootstrapSecret(v kubevirtv1.Volume) string {
	switch {
	case v.CloudInitNoCloud != nil && v.CloudInitNoCloud.UserDataSecretRef != nil:
		return v.CloudInitNoCloud.UserDataSecretRef.Name
	case v.Secret != nil:
		return v.Secret.SecretName
	}
	return ""
}

// source is sources' credential Secret name if it is another VM's than
// vm's: labelled as guestbackup's, and named for the VM it is labelled for.
func source(sources map[string]*corev1.Secret, name, vm string) *corev1.Secret {
	s := sources[name]
	if s == nil || s.Name != name || !vmsecret.IsManaged(s) || !vmsecret.IsNamedFor(s) || vmsecret.VM(s) == vm {
		return nil
	}
	return s
}

// adoptCopy makes a copied injection this VM's own. A copy of an injected
// VM reads its source's credential Secret, and the status it carries (if
// any) is its source's: left so, it would boot as the source's identity
// and write into its history. Its volumes are pointed at the VM's own
// Secret (the patch returned, and the VM returned, with those volumes; vm
// itself stays as it is), and what was injected (the copied status, or,
// without one, what the volumes show) is taken as this VM's, to be issued
// its own credentials. The source's Secret is only read, for the owner's
// own user-data when it was merged.
func adoptCopy(vm *kubevirtv1.VirtualMachine, pr prior, sources map[string]*corev1.Secret) (*kubevirtv1.VirtualMachine, prior, []jsonpatch.JsonPatchOperation, string) {
	own := SecretName(vm.Name)
	spec := &vm.Spec.Template.Spec
	from := ""
	switch {
	case pr.known && pr.status.Secret != own:
		from = pr.status.Secret
	case !pr.known:
		for _, v := range spec.Volumes {
			if name := bootstrapSecret(v); name != own && source(sources, name, vm.Name) != nil {
				from = name
				break
			}
		}
	}
	if from == "" {
		return vm, pr, nil, ""
	}
	src := source(sources, from, vm.Name)
	volumes, ops := repoint(spec.Volumes, from, own)
	first := slices.IndexFunc(spec.Volumes, func(v kubevirtv1.Volume) bool { return bootstrapSecret(v) == from })
	if first < 0 {
		// Only the annotation was copied: nothing was injected here.
		return vm, prior{written: pr.written}, nil, ""
	}
	st := pr.status
	v := spec.Volumes[first]
	if !pr.known {
		// The status was not copied: what was injected is what the
		// volume shows.
		st = injectedThrough(spec, v, src)
	}
	if st.MergedFrom != "" && src == nil {
		return vm, pr, nil, fmt.Sprintf("VirtualMachine %s/%s is a copy of a VM guestbackup injected: its volume %s reads Secret %s, which does not exist any more, and only it held the owner's own user-data; put the VM's own cloud-init back into volume %s (%s) and remove annotation %s",
			vm.Namespace, vm.Name, v.Name, from, v.Name, st.MergedFrom, v1alpha1.AnnotationStatus)
	}
	st.Secret = own
	return withVolumes(vm, volumes), prior{status: st, known: true, written: pr.written, copied: true, source: src}, ops, ""
}

// repoint is volumes with every bootstrap volume that reads Secret from
// (bootstrapSecret) reading Secret to instead, and the patch that does the
// same to the object; volumes itself stays as it is.
func repoint(volumes []kubevirtv1.Volume, from, to string) ([]kubevirtv1.Volume, []jsonpatch.JsonPatchOperation) {
	out := slices.Clone(volumes)
	var ops []jsonpatch.JsonPatchOperation
	for i := range out {
		v := &out[i]
		if bootstrapSecret(*v) != from {
			continue
		}
		base := fmt.Sprintf("/spec/template/spec/volumes/%d", i)
		if v.Secret != nil {
			ops = append(ops, jsonpatch.NewOperation("replace", base+"/secret/secretName", to))
			v.Secret = &kubevirtv1.SecretVolumeSource{SecretName: to, VolumeLabel: v.Secret.VolumeLabel, Optional: v.Secret.Optional}
		} else {
			ops = append(ops, jsonpatch.NewOperation("replace", base+"/cloudInitNoCloud/secretRef/name", to))
			nc := *v.CloudInitNoCloud
			nc.UserDataSecretRef = &corev1.LocalObjectReference{Name: to}
			v.CloudInitNoCloud = &nc
		}
	}
	return out, ops
}

// withVolumes is vm with its template's volumes replaced: a shallow copy
// that shares everything else with vm.
func withVolumes(vm *kubevirtv1.VirtualMachine, volumes []kubevirtv1.Volume) *kubevirtv1.VirtualMachine {
	c := *vm
	template := *vm.Spec.Template
	template.Spec.Volumes = volumes
	c.Spec.Template = &template
	return &c
}

// statusOp writes st as the status annotation; replace says the object
// already has one.
func statusOp(st v1alpha1.InjectionStatus, replace bool) (jsonpatch.JsonPatchOperation, error) {
	data, err := json.Marshal(st)
	if err != nil {
		return jsonpatch.JsonPatchOperation{}, fmt.Errorf("encode the status annotation: %w", err)
	}
	op := "add"
	if replace {
		op = "replace"
	}
	return jsonpatch.NewOperation(op, "/metadata/annotations/"+escape(v1alpha1.AnnotationStatus), string(data)), nil
}

// credentials are a VM's Kopia identity, password and generation.
type credentials struct {
	password   string
	generation int64
	issued     bool // new ones, for an Event
	rotated    bool // new ones the VM asked for (its rotate annotation)
}

func currentCredentials(secret *corev1.Secret, server types.NamespacedName) (credentials, bool) {
	if secret == nil || vmsecret.Server(secret) != server {
		return credentials{}, false
	}
	password := vmsecret.Password(secret)
	generation, ok := vmsecret.GenerationNumber(secret)
	if password == "" || !ok {
		return credentials{}, false
	}
	return credentials{password: password, generation: generation}, true
}

// placement is where the bootstrap goes in the template.
type placement struct {
	mode       string // v1alpha1.ModeCloudInit or ModeDisk
	volume     string
	disk       string
	mergedFrom string
	userPart   []byte // the VM's own user-data, when merged
	// diskWhy is why disk mode was chosen for a VM that did not ask for
	// it: its guest must have the disk unit, and is told so.
	diskWhy string
}

// inject gives vm (of shape s) its bootstrap: its credentials, where the
// bootstrap goes, the Secret that carries it and the status annotation
// that records it, and tells what was issued.
func inject(vm *kubevirtv1.VirtualMachine, s shape, o options, pr prior, in Input) (Decision, error) {
	creds, err := credentialsFor(in.Secret, o.server, o.rotate, pr, in.NewPassword)
	if err != nil {
		return Decision{}, err
	}
	where, patch, refusal := placementFor(vm, s, o.mode, pr, in.Secret)
	if refusal != "" {
		return deny("%s", refusal), nil
	}
	if refusal := keepsOwnersPart(vm, where, pr, in); refusal != "" {
		return deny("%s", refusal), nil
	}
	secret, err := desiredSecret(vm, o, creds, in.Server.BSLS, where, in.Secret, in.OldObject == nil, in.Now)
	if err != nil {
		return deny("guestbackup cannot render this VM's bootstrap: %v", err), nil
	}
	if status := injectionStatus(vm.Name, o, creds, where); !pr.written || status != pr.status {
		op, err := statusOp(status, pr.written)
		if err != nil {
			return Decision{}, err
		}
		patch = append(patch, op)
	}
	d := Decision{Patch: patch, Secret: secret, Outcome: injectionOutcome(creds, len(patch) > 0 || secret != nil)}
	if creds.issued {
		// New credentials always change the Secret: it is never nil here.
		msg := issuedMessage(vm.Name, o, creds, where)
		if secret.Annotations == nil {
			secret.Annotations = map[string]string{}
		}
		secret.Annotations[vmsecret.AnnotationIssuedAt] = in.Now.UTC().Format(time.RFC3339Nano)
		if vm.UID == "" {
			// A VM being created has no UID: an Event now would never
			// show in kubectl describe. The controller records it once
			// the VM exists.
			secret.Annotations[vmsecret.AnnotationIssuedEvent] = msg
		} else {
			d.Events = append(d.Events, vmevent.Normal(ReasonCredentialsIssued, msg))
		}
	}
	return d, nil
}

// credentialsFor is the VM's credentials after admission: its Secret's
// while they are for server, and no rotation was asked since they were
// issued (rotate, the VM's rotate annotation, differs from the one the
// status recorded); else new ones, of the generation after the Secret's.
func credentialsFor(secret *corev1.Secret, server types.NamespacedName, rotate string, pr prior, newPassword func() (string, error)) (credentials, error) {
	creds, ok := currentCredentials(secret, server)
	rotated := pr.known && ok && pr.status.Rotate != rotate
	if ok && !rotated {
		return creds, nil
	}
	password, err := newPassword()
	if err != nil {
		return credentials{}, fmt.Errorf("generate a password: %w", err)
	}
	generation := int64(1)
	if g, ok := vmsecret.GenerationNumber(secret); ok {
		generation = g + 1
	}
	return credentials{password: password, generation: generation, issued: true, rotated: rotated}, nil
}

// placementFor is where vm's bootstrap goes, with the patch that puts it
// there, or why it cannot go anywhere: where the status says, while the
// template still has it (the owner's part read back from the Secret it was
// merged into: secret, or a copy's source's); else chosen afresh (place).
// A mode annotation that changed since the bootstrap was injected is
// refused: its volume would be left behind.
func placementFor(vm *kubevirtv1.VirtualMachine, s shape, mode string, pr prior, secret *corev1.Secret) (placement, []jsonpatch.JsonPatchOperation, string) {
	old := pr.status
	if !pr.known || !stillInjected(&vm.Spec.Template.Spec, old) {
		return place(vm, s, mode)
	}
	if mode != "" && mode != old.Mode {
		return placement{}, nil, fmt.Sprintf("annotation %s changed from %s to %s after the bootstrap was injected: remove annotation %s (guestbackup then removes what it added), then opt in again with the new mode", v1alpha1.AnnotationMode, old.Mode, mode, v1alpha1.AnnotationServer)
	}
	p := placement{mode: old.Mode, volume: old.Volume, disk: old.Disk, mergedFrom: old.MergedFrom}
	if p.mergedFrom == "" {
		return p, nil, ""
	}
	if pr.copied {
		secret = pr.source
	}
	part, err := cloudinit.UserPart(secretData(secret, vmsecret.KeyUserData))
	if err != nil {
		return placement{}, nil, fmt.Sprintf("Secret %s/%s no longer holds the VM's own user-data (%v): remove annotation %s, restore the VM's cloud-init, and admit it again", vm.Namespace, old.Secret, err, v1alpha1.AnnotationStatus)
	}
	p.userPart = part
	return p, nil, ""
}

// injectionStatus is the status annotation that records the injection of
// VM vm's bootstrap at p, with creds.
func injectionStatus(vm string, o options, creds credentials, p placement) v1alpha1.InjectionStatus {
	return v1alpha1.InjectionStatus{
		Mode: p.mode, Server: o.server.String(), Secret: SecretName(vm), User: o.user,
		Generation: creds.generation, Rotate: o.rotate, Volume: p.volume, Disk: p.disk, MergedFrom: p.mergedFrom,
	}
}

// injectionOutcome names an injection for metrics: credentials rotated or
// issued, else whether it changed anything (the VM or its Secret).
func injectionOutcome(creds credentials, changed bool) string {
	switch {
	case creds.rotated:
		return OutcomeRotated
	case creds.issued:
		return OutcomeIssued
	case changed:
		return OutcomeUpdated
	}
	return OutcomeUnchanged
}

// issuedMessage is the CredentialsIssued Event's message about new
// credentials creds of VM vm, placed at p: a guest given disk mode it did
// not ask for needs guestbackup's disk unit, and its owner is told.
func issuedMessage(vm string, o options, creds credentials, p placement) string {
	what := "Issued"
	if creds.rotated {
		what = "Rotated"
	}
	mode := p.mode + " mode"
	if p.diskWhy != "" {
		mode += " because " + p.diskWhy + ": the guest needs guestbackup's disk unit (docs/guest.md, Disk mode)"
	}
	return fmt.Sprintf("%s Kopia credentials for %s on BackupStorageLocationServer %s (generation %d, %s, Secret %s)", what, o.user, o.server, creds.generation, mode, SecretName(vm))
}

// keepsOwnersPart says why the payload placement p would lose the owner's
// own user-data that the VM's Secret holds, "" when it would not. The
// Secret may be the only copy of it, so a payload without a part of the
// owner's is never written over one with it while the VM still counts on
// it: an update (the status annotation says nothing was merged, or the
// volume it was merged from was removed), or a VM whose volume reads the
// Secret by any field (vmsecret.SecretsRead: a config drive reads its
// user-data too). An owner who moved their cloud-init elsewhere (a volume
// of its own, a Secret of theirs, a config drive that reads neither) no
// longer needs it; a VM
// created anew that reads nothing of it finds the Secret of a deleted VM
// of the same name. A copy's Secret is its own and holds no part yet.
func keepsOwnersPart(vm *kubevirtv1.VirtualMachine, p placement, pr prior, in Input) string {
	secret := in.Secret
	if pr.copied || p.userPart != nil || secret == nil {
		return ""
	}
	if _, err := cloudinit.UserPart(secret.Data[vmsecret.KeyUserData]); err != nil {
		return ""
	}
	own := SecretName(vm.Name)
	reads := false
	for _, v := range vm.Spec.Template.Spec.Volumes {
		// Any field that names the Secret reads it: a config drive reads
		// its user-data as the NoCloud volume did.
		readsOwn := slices.Contains(vmsecret.SecretsRead(v.VolumeSource), own)
		switch {
		case (v.CloudInitConfigDrive != nil || v.CloudInitNoCloud != nil) && !readsOwn:
			return "" // the owner's cloud-init is elsewhere now
		case readsOwn:
			reads = true
		}
	}
	if in.OldObject == nil && !reads {
		return ""
	}
	return fmt.Sprintf("Secret %s/%s holds this VM's own cloud-init user-data, merged with guestbackup's bootstrap, and this admission would replace it with the bootstrap alone (%s mode, volume %s): guestbackup never drops the owner's user-data; give the VM a cloudInitNoCloud volume whose userData is your own cloud-init (its copy is the second part of key %s in that Secret), or remove annotation %s from a VM whose volume still reads the Secret to get it back",
		vm.Namespace, secret.Name, p.mode, p.volume, vmsecret.KeyUserData, v1alpha1.AnnotationServer)
}

// stillInjected reports whether the template still has what the status
// says was added.
func stillInjected(spec *kubevirtv1.VirtualMachineInstanceSpec, st v1alpha1.InjectionStatus) bool {
	i := volumeIndex(spec, st.Volume)
	if i < 0 {
		return false
	}
	v := spec.Volumes[i]
	switch {
	case st.Mode == v1alpha1.ModeDisk:
		return v.Secret != nil && v.Secret.SecretName == st.Secret
	default:
		return v.CloudInitNoCloud != nil && v.CloudInitNoCloud.UserDataSecretRef != nil && v.CloudInitNoCloud.UserDataSecretRef.Name == st.Secret
	}
}

// place chooses how the bootstrap reaches the guest and returns the patch
// that puts it there, or why it cannot; s is the shape of the VM's object.
func place(vm *kubevirtv1.VirtualMachine, s shape, mode string) (placement, []jsonpatch.JsonPatchOperation, string) {
	spec := &vm.Spec.Template.Spec
	secret := SecretName(vm.Name)
	// Guests that read no NoCloud would be given a bootstrap they never
	// see: their owners are told what to do instead.
	for _, v := range spec.Volumes {
		if v.Sysprep != nil {
			return placement{}, nil, fmt.Sprintf("VirtualMachine %s/%s is configured by sysprep (volume %s): guestbackup bootstraps Linux guests through cloud-init or a disk its unit reads, and a Windows guest reads neither; remove annotation %s",
				vm.Namespace, vm.Name, v.Name, v1alpha1.AnnotationServer)
		}
	}
	if _, ok := vm.Spec.Template.ObjectMeta.Annotations[kubevirtv1.IgnitionAnnotation]; ok && mode != v1alpha1.ModeDisk {
		return placement{}, nil, fmt.Sprintf("VirtualMachine %s/%s is configured by Ignition (annotation %s of spec.template), which reads no NoCloud volume: install guestbackup's disk unit through your Ignition config (docs/guest.md, Disk mode) and set annotation %s=%s, or remove annotation %s",
			vm.Namespace, vm.Name, kubevirtv1.IgnitionAnnotation, v1alpha1.AnnotationMode, v1alpha1.ModeDisk, v1alpha1.AnnotationServer)
	}
	ci := -1
	for i, v := range spec.Volumes {
		if v.CloudInitNoCloud != nil || v.CloudInitConfigDrive != nil {
			ci = i
			break // KubeVirt uses only the first
		}
	}
	why := ""
	switch {
	case mode == v1alpha1.ModeDisk:
	case ci < 0:
		if volumeIndex(spec, CloudInitVolume) >= 0 || diskIndex(spec, CloudInitVolume) >= 0 {
			return placement{}, nil, fmt.Sprintf("the VM already has a volume or disk named %s that guestbackup did not add: rename it", CloudInitVolume)
		}
		p := placement{mode: v1alpha1.ModeCloudInit, volume: CloudInitVolume, disk: CloudInitVolume}
		vol := map[string]any{"name": CloudInitVolume, "cloudInitNoCloud": map[string]any{"secretRef": map[string]any{"name": secret}}}
		disk := map[string]any{"name": CloudInitVolume, "disk": map[string]any{"bus": "virtio"}}
		return p, appendVolumeAndDisk(s, vol, disk), ""
	case spec.Volumes[ci].CloudInitNoCloud != nil:
		nc := spec.Volumes[ci].CloudInitNoCloud
		var user []byte
		field := ""
		switch {
		case nc.UserData != "":
			user, field = []byte(nc.UserData), "userData"
		case nc.UserDataBase64 != "":
			decoded, err := base64.StdEncoding.DecodeString(nc.UserDataBase64)
			if err != nil {
				why = "its cloudInitNoCloud.userDataBase64 is not base64"
				break
			}
			user, field = decoded, "userDataBase64"
		case nc.UserDataSecretRef != nil && nc.UserDataSecretRef.Name == secret:
			// Its own credential Secret, which does not exist (or the
			// VM's record of it would have been recovered from it): the
			// owner's cloud-init merged there is gone with it, and a
			// Secret rendered now would not carry it.
			return placement{}, nil, fmt.Sprintf("VirtualMachine %s/%s's cloud-init volume %s reads Secret %s, guestbackup's own for this VM, which does not exist any more (a VM of this name was deleted, and its Secret with it): only it held the user-data merged there; put your own cloud-init back into volume %s (cloudInitNoCloud.userData) and apply the VM again",
				vm.Namespace, vm.Name, spec.Volumes[ci].Name, secret, spec.Volumes[ci].Name)
		case nc.UserDataSecretRef != nil:
			why = "its cloud-init user-data is in Secret " + nc.UserDataSecretRef.Name + ", which guestbackup does not rewrite"
		default:
			why = "its cloudInitNoCloud volume has no user-data"
		}
		if field != "" && spec.Volumes[ci].Name == "" {
			return placement{}, nil, "its cloud-init volume has no name"
		}
		if field != "" {
			if !cloudinit.CanMerge(user) {
				why = fmt.Sprintf("its inline %s user-data cannot carry a second part", cloudinit.DetectFormat(user))
				break
			}
			name := spec.Volumes[ci].Name
			base := fmt.Sprintf("/spec/template/spec/volumes/%d/cloudInitNoCloud", ci)
			p := placement{mode: v1alpha1.ModeCloudInit, volume: name, mergedFrom: field, userPart: user}
			return p, []jsonpatch.JsonPatchOperation{
				jsonpatch.NewOperation("remove", base+"/"+field, nil),
				jsonpatch.NewOperation("add", base+"/secretRef", map[string]any{"name": secret}),
			}, ""
		}
	default:
		why = "it uses a cloudInitConfigDrive volume"
	}
	if mode == v1alpha1.ModeCloudInit {
		return placement{}, nil, fmt.Sprintf("annotation %s=%s cannot be honoured: %s; remove the annotation to get the bootstrap as a disk instead", v1alpha1.AnnotationMode, mode, why)
	}
	if volumeIndex(spec, DiskVolume) >= 0 || diskIndex(spec, DiskVolume) >= 0 {
		return placement{}, nil, fmt.Sprintf("the VM already has a volume or disk named %s that guestbackup did not add: rename it", DiskVolume)
	}
	p := placement{mode: v1alpha1.ModeDisk, volume: DiskVolume, disk: DiskVolume, diskWhy: why}
	vol := map[string]any{"name": DiskVolume, "secret": map[string]any{"secretName": secret, "volumeLabel": DiskLabel}}
	disk := map[string]any{"name": DiskVolume, "serial": DiskSerial, "disk": map[string]any{"bus": "virtio"}}
	return p, appendVolumeAndDisk(s, vol, disk), ""
}

// rendered is the placement as cloudinit renders it: the owner's part
// only when it was merged.
func (p placement) rendered() cloudinit.Placement {
	cp := cloudinit.Placement{Mode: p.mode}
	if p.mergedFrom != "" {
		cp.UserPart = p.userPart
	}
	return cp
}

// desiredSecret is the VM's Secret after admission, with its payload
// rendered for server (vmsecret.Render), or nil when the existing one
// already is, rendered at now. Keys the controller adds (the hash) and
// metadata others set are kept.
func desiredSecret(vm *kubevirtv1.VirtualMachine, o options, c credentials, server *v1alpha1.BackupStorageLocationServer, p placement, existing *corev1.Secret, creating bool, now time.Time) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	if existing != nil {
		s = existing.DeepCopy()
	}
	s.Name, s.Namespace, s.Type = SecretName(vm.Name), vm.Namespace, corev1.SecretTypeOpaque
	if creating {
		// No VM of this name exists (Input.AlreadyExists): a reference to
		// a VM is to the one that was deleted, for which a garbage
		// collector would delete the Secret, and with it the owner's
		// user-data it may hold. The controller adopts it for the new VM.
		// (Not the UID's absence: an update's object may lack it too.)
		s.OwnerReferences = slices.DeleteFunc(s.OwnerReferences, vmsecret.IsVMReference)
	}
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	maps.Copy(s.Labels, vmsecret.Labels(vm.Name, o.server))
	guest := vmsecret.Guest{Username: o.user, Password: c.password, Generation: c.generation, Paths: o.paths, Schedule: o.schedule}
	if err := vmsecret.Render(s, server, guest, p.rendered(), now); err != nil {
		return nil, err
	}
	// The username key is for the guest; the server's user comes from
	// the VM that controls the Secret (vmsecret.Identity), never from it.
	s.Data[vmsecret.KeyUsername] = []byte(o.user)
	s.Data[vmsecret.KeyPassword] = []byte(c.password)
	s.Data[vmsecret.KeyGeneration] = []byte(strconv.FormatInt(c.generation, 10))
	if existing != nil && maps.EqualFunc(existing.Data, s.Data, func(a, b []byte) bool { return string(a) == string(b) }) &&
		maps.Equal(existing.Labels, s.Labels) && maps.Equal(existing.Annotations, s.Annotations) &&
		len(existing.OwnerReferences) == len(s.OwnerReferences) {
		return nil, nil //nolint:nilnil // nil: the existing Secret already is what it must be
	}
	return s, nil
}

// optOut removes what the status says was injected and gives the VM its
// own user-data back.
func optOut(vm *kubevirtv1.VirtualMachine, pr prior, secret *corev1.Secret) Decision {
	st := pr.status
	var ops []jsonpatch.JsonPatchOperation
	if vm.Spec.Template != nil {
		spec := &vm.Spec.Template.Spec
		if i := volumeIndex(spec, st.Volume); i >= 0 {
			if st.MergedFrom != "" {
				if nc := spec.Volumes[i].CloudInitNoCloud; nc != nil && nc.UserDataSecretRef != nil && nc.UserDataSecretRef.Name == st.Secret {
					part, err := cloudinit.UserPart(secretData(secret, vmsecret.KeyUserData))
					if err != nil {
						return deny("guestbackup cannot give this VM its own cloud-init back: Secret %s/%s: %v; set spec.template.spec.volumes[%d].cloudInitNoCloud.%s yourself and remove annotation %s", vm.Namespace, st.Secret, err, i, st.MergedFrom, v1alpha1.AnnotationStatus)
					}
					value := string(part)
					if st.MergedFrom == "userDataBase64" {
						value = base64.StdEncoding.EncodeToString(part)
					}
					base := fmt.Sprintf("/spec/template/spec/volumes/%d/cloudInitNoCloud", i)
					ops = append(ops,
						jsonpatch.NewOperation("remove", base+"/secretRef", nil),
						jsonpatch.NewOperation("add", base+"/"+st.MergedFrom, value))
				}
			} else if owned(spec.Volumes[i], st) {
				ops = append(ops, removeItem("/spec/template/spec/volumes", i, len(spec.Volumes)))
			}
		}
		if st.Disk != "" {
			if i := diskIndex(spec, st.Disk); i >= 0 {
				ops = append(ops, removeItem("/spec/template/spec/domain/devices/disks", i, len(spec.Domain.Devices.Disks)))
			}
		}
	}
	if pr.written {
		ops = append(ops, jsonpatch.NewOperation("remove", "/metadata/annotations/"+escape(v1alpha1.AnnotationStatus), nil))
	}
	return Decision{Patch: ops, Outcome: OutcomeRemoved}
}

// removeItem removes item i of the list at path; the list itself when it
// was its only item, as it was before guestbackup added one (KubeVirt reads
// an empty list and none alike).
func removeItem(path string, i, n int) jsonpatch.JsonPatchOperation {
	if n == 1 {
		return jsonpatch.NewOperation("remove", path, nil)
	}
	return jsonpatch.NewOperation("remove", fmt.Sprintf("%s/%d", path, i), nil)
}

// owned reports whether a volume is the one guestbackup added.
func owned(v kubevirtv1.Volume, st v1alpha1.InjectionStatus) bool {
	return st.Secret != "" && bootstrapSecret(v) == st.Secret
}

func volumeIndex(spec *kubevirtv1.VirtualMachineInstanceSpec, name string) int {
	return slices.IndexFunc(spec.Volumes, func(v kubevirtv1.Volume) bool { return v.Name == name })
}

func diskIndex(spec *kubevirtv1.VirtualMachineInstanceSpec, name string) int {
	return slices.IndexFunc(spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return d.Name == name })
}

func secretData(s *corev1.Secret, key string) []byte {
	if s == nil {
		return nil
	}
	return s.Data[key]
}

// escape encodes a JSON pointer token.
func escape(token string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(token)
}
