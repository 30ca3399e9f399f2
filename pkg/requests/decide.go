// Package requests admits the requests VM owners make from the cluster,
// GuestSnapshot and GuestRestore (docs/requests.md): it stamps who asked
// into the request and refuses, with a message that says what to fix, a
// request for a VM that does not exist or is not opted in, from another
// VM's snapshots without that VM's grant, or with paths, a target or a
// time that cannot be carried out. The decisions are this file's pure
// functions; Handler only gathers their inputs and applies them.
package requests

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// RequesterOf is who asked, as the API server authenticated them: the
// admission request's user info, copied whole. The webhook writes it over
// whatever the client sent (see Handler), so a request records its real
// author even when its manifest was copied from another request.
func RequesterOf(u authenticationv1.UserInfo) v1alpha1.Requester {
	r := v1alpha1.Requester{Username: u.Username, UID: u.UID, Groups: slices.Clone(u.Groups)}
	if len(u.Extra) > 0 {
		r.Extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			r.Extra[k] = slices.Clone([]string(v))
		}
	}
	return r
}

// VM is what a decision knows of a VirtualMachine a request names: nil
// when no VM of that name exists in the request's namespace.
type VM = metav1.PartialObjectMetadata

// ValidateSnapshot says what is wrong with GuestSnapshot spec in
// namespace, for VM vm (nil: it does not exist), one problem per entry,
// each saying what to fix; none when it may be admitted.
func ValidateSnapshot(namespace string, spec v1alpha1.GuestSnapshotSpec, vm *VM) []string {
	problems := checkVM("spec.vm", spec.VM, namespace, vm)
	problems = append(problems, checkPaths("spec.paths", spec.Paths)...)
	if len(spec.Paths) == 0 && vm != nil && strings.TrimSpace(vm.Annotations[v1alpha1.AnnotationPaths]) == "" {
		problems = append(problems, fmt.Sprintf("spec.paths: empty, and VirtualMachine %s has no annotation %s to take them from: list the absolute paths to snapshot",
			spec.VM, v1alpha1.AnnotationPaths))
	}
	return problems
}

// ValidateRestore says what is wrong with GuestRestore spec in namespace,
// for VM vm (nil: it does not exist), at time now, one problem per entry,
// each saying what to fix; none when it may be admitted. A source other
// than the VM itself needs the VM's grant, by the rule the controller
// provisions grants by (userset.RestoreFrom): nothing more permissive than
// what the guest itself may read.
func ValidateRestore(namespace string, spec v1alpha1.GuestRestoreSpec, vm *VM, now time.Time) []string {
	problems := checkVM("spec.vm", spec.VM, namespace, vm)
	if spec.SourceVM != "" && spec.SourceVM != spec.VM {
		problems = append(problems, checkSource(namespace, spec, vm)...)
	}
	if len(spec.Paths) == 0 {
		problems = append(problems, "spec.paths: empty: list the absolute paths, as snapshotted, to restore")
	}
	problems = append(problems, checkPaths("spec.paths", spec.Paths)...)
	problems = append(problems, checkSnapshot(spec.Snapshot, now)...)
	return append(problems, checkTarget(spec.Target)...)
}

// checkVM checks that name names an existing, opted-in VM of namespace.
func checkVM(field, name, namespace string, vm *VM) []string {
	if problem := checkVMName(field, name, namespace); problem != "" {
		return []string{problem}
	}
	if vm == nil {
		return []string{fmt.Sprintf("%s: no VirtualMachine %s in namespace %s: name a VM of this request's namespace", field, name, namespace)}
	}
	if _, ok := vm.Annotations[v1alpha1.AnnotationServer]; !ok {
		return []string{fmt.Sprintf("%s: VirtualMachine %s is not opted in to guestbackup: annotate it with %s=<namespace>/<server> first (docs/guest.md)",
			field, name, v1alpha1.AnnotationServer)}
	}
	return nil
}

// checkVMName checks that name can name a VM of namespace: a request
// names VMs of its own namespace by name alone, so that it can never
// reach another namespace's.
func checkVMName(field, name, namespace string) string {
	errs := validation.IsDNS1123Subdomain(name)
	switch {
	case len(errs) == 0:
		return ""
	case strings.ContainsAny(name, "/@"):
		return fmt.Sprintf("%s: %q names a VM of another namespace, which a request can never reach: create the request in that VM's namespace, naming the VM alone", field, name)
	default:
		return fmt.Sprintf("%s: %q is not a VirtualMachine name (%s)", field, name, strings.Join(errs, "; "))
	}
}

// checkSource checks that spec's VM may read the snapshots of spec's
// SourceVM: its annotation guestbackup.io/restore-from grants it.
func checkSource(namespace string, spec v1alpha1.GuestRestoreSpec, vm *VM) []string {
	if problem := checkVMName("spec.sourceVM", spec.SourceVM, namespace); problem != "" {
		return []string{problem}
	}
	if vm == nil {
		return nil // checkVM said so
	}
	grant, refusal := userset.RestoreFrom(spec.VM, namespace, vm.Annotations)
	switch {
	case refusal != "":
		return []string{fmt.Sprintf("spec.sourceVM: VirtualMachine %s may not read the snapshots of %s: its %s", spec.VM, spec.SourceVM, refusal)}
	case grant == nil || grant.Source != identity.OfVM(spec.SourceVM, namespace):
		return []string{fmt.Sprintf("spec.sourceVM: VirtualMachine %s may not read the snapshots of %s: annotate it with %s=%s to grant it (docs/guest.md, \"A file from a VM that is gone\")",
			spec.VM, spec.SourceVM, v1alpha1.AnnotationRestoreFrom, spec.SourceVM)}
	}
	return nil
}

// checkPaths checks each path (checkPath), naming it by its index.
func checkPaths(field string, paths []string) []string {
	var problems []string
	for i, p := range paths {
		if problem := checkPath(fmt.Sprintf("%s[%d]", field, i), p); problem != "" {
			problems = append(problems, problem)
		}
	}
	return problems
}

// checkPath checks that path p of field is absolute and climbs nowhere: a
// path names what was snapshotted, or a folder, as the guest sees it.
func checkPath(field, p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Sprintf("%s: %q is not absolute: name the path as the guest sees it, starting with /", field, p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return fmt.Sprintf("%s: %q contains \"..\": name the path itself, without ..", field, p)
	case strings.ContainsRune(p, 0):
		return fmt.Sprintf("%s: contains a NUL character, which no path holds", field)
	}
	return ""
}

// checkSnapshot checks the snapshot selector: a time to restore "before"
// must be in the past, or it only means the latest, ambiguously.
func checkSnapshot(s v1alpha1.SnapshotSelector, now time.Time) []string {
	var problems []string
	if s.ID != "" && s.Before != nil {
		problems = append(problems, "spec.snapshot: choose the snapshot by id or by before, not both; set neither for the latest")
	}
	if s.ID != "" && strings.IndexFunc(s.ID, func(r rune) bool { return !isAlnum(r) }) >= 0 {
		problems = append(problems, fmt.Sprintf("spec.snapshot.id: %q is not a snapshot ID (letters and digits, as `guestbackup-kopia snapshot list` prints them)", s.ID))
	}
	if s.Before != nil && s.Before.After(now) {
		problems = append(problems, fmt.Sprintf("spec.snapshot.before: %s is in the future: give a time in the past (RFC 3339), or leave the selector empty for the latest snapshot",
			s.Before.UTC().Format(time.RFC3339)))
	}
	return problems
}

func isAlnum(r rune) bool {
	return r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
}

// checkTarget checks that the target is one of the allowed forms: the
// default folder, another absolute folder of the guest, in place, or a
// claim of the namespace, existing or new.
func checkTarget(t v1alpha1.RestoreTarget) []string {
	forms := 0
	for _, set := range []bool{t.Directory != "", t.InPlace, t.PersistentVolumeClaim != nil} {
		if set {
			forms++
		}
	}
	if forms > 1 {
		return []string{"spec.target: set at most one of directory, inPlace and persistentVolumeClaim; none restores into " + v1alpha1.RestoresFolder + "/<request name> in the guest"}
	}
	var problems []string
	if t.Directory != "" {
		switch problem := checkPath("spec.target.directory", t.Directory); {
		case problem != "":
			problems = append(problems, problem)
		case strings.Trim(t.Directory, "/") == "":
			problems = append(problems, "spec.target.directory: \"/\" restores over the guest's own files: set target.inPlace to mean that, or name another folder")
		}
	}
	if c := t.PersistentVolumeClaim; c != nil {
		switch {
		case (c.ClaimName == "") == (c.Size == nil):
			problems = append(problems, "spec.target.persistentVolumeClaim: set claimName to restore into an existing claim, or size to create one named after the request")
		case c.ClaimName != "":
			if errs := validation.IsDNS1123Subdomain(c.ClaimName); len(errs) > 0 {
				problems = append(problems, fmt.Sprintf("spec.target.persistentVolumeClaim.claimName: %q is not a claim name (%s); name a claim of this request's namespace",
					c.ClaimName, strings.Join(errs, "; ")))
			}
			if c.StorageClassName != nil {
				problems = append(problems, "spec.target.persistentVolumeClaim.storageClassName: applies only to a claim created with size")
			}
		case c.Size.Sign() <= 0:
			problems = append(problems, fmt.Sprintf("spec.target.persistentVolumeClaim.size: %s: give the new claim a positive size", c.Size))
		}
	}
	return problems
}

// Unreadable says what to fix in a request whose spec cannot be read: a
// time that is no RFC 3339 time (spec.snapshot.before, its only time), or
// any other value of the wrong form, as the decoder found it.
func Unreadable(err error) string {
	var t *time.ParseError
	if errors.As(err, &t) {
		return fmt.Sprintf("spec.snapshot.before: %q is not a time: give one in RFC 3339, such as 2026-12-06T18:00:00Z", t.Value)
	}
	return fmt.Sprintf("its spec cannot be read (%v): give each field the form docs/requests.md describes", err)
}

// Message joins problems into one denial, naming the request.
func Message(kind, name string, problems []string) string {
	return fmt.Sprintf("guestbackup cannot admit %s %s: %s", kind, name, strings.Join(problems, "; "))
}
