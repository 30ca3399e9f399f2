// Package mutate decides what guestbackup's admission webhook does to an
// opted-in VirtualMachine. Decisions are pure functions of the VM, its
// annotations and the server it names; the webhook applies them.
package mutate

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// ParseServerRef parses the value of the guestbackup.io/server annotation:
// <namespace>/<name> of a BackupStorageLocationServer.
func ParseServerRef(value string) (types.NamespacedName, error) {
	return vmsecret.ParseServerRef(value)
}

// Username is the Kopia identity of a VM: <vm-name>@<vm-namespace>
// (identity.OfVM). It is stable across re-creation of the VM, so a VM
// restored by GitOps sees its own old snapshots. It fails for a VM whose
// name cannot carry guestbackup's credentials: the VM's Secret is named
// and labelled after it (vmsecret.ValidateVMName), and its identity must
// be a Kopia user name.
func Username(vmName, vmNamespace string) (string, error) {
	if err := vmsecret.ValidateVMName(vmName); err != nil {
		return "", fmt.Errorf("VirtualMachine %s/%s cannot get guestbackup credentials: %w", vmNamespace, vmName, err)
	}
	username := identity.OfVM(vmName, vmNamespace)
	if err := identity.ValidateUsername(username); err != nil {
		return "", fmt.Errorf("VirtualMachine %s/%s has no valid Kopia identity: %w", vmNamespace, vmName, err)
	}
	return username, nil
}
