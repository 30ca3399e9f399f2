// Package mutate decides what guestbackup's admission webhook does to an
// opted-in VirtualMachine. Decisions are pure functions of the VM, its
// annotations and the server it names; the webhook applies them.
package mutate

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
)

// ParseServerRef parses the value of the guestbackup.io/server annotation:
// <namespace>/<name> of a BackupStorageLocationServer.
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

// Username is the Kopia identity of a VM: <vm-name>@<vm-namespace>. It is
// stable across re-creation of the VM, so a VM restored by GitOps sees its
// own old snapshots.
func Username(vmName, vmNamespace string) (string, error) {
	username := vmName + "@" + vmNamespace
	if err := kopiauser.ValidateUsername(username); err != nil {
		return "", fmt.Errorf("VirtualMachine %s/%s has no valid Kopia identity: %w", vmNamespace, vmName, err)
	}
	return username, nil
}
