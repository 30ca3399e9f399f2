package cloudinit

import (
	"fmt"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// Placement is how a VM's bootstrap reaches its guest, as far as the
// payload is concerned.
type Placement struct {
	// Mode is v1alpha1.ModeCloudInit or v1alpha1.ModeDisk.
	Mode string
	// UserPart is the VM's own user-data, merged before the bootstrap
	// (Merge) in cloud-init mode; nil when the VM had none to merge.
	UserPart []byte
}

// Payload renders the payload of a VM's credential Secret: the user-data
// (key v1alpha1.SecretKeyUserData) in cloud-init mode, the disk's files
// (DiskFiles) in disk mode. The webhook renders it at admission and the
// controller again when the VM's server publishes another endpoint or CA:
// one rendering, so both write the same bytes for the same input.
func Payload(b Bootstrap, p Placement) (map[string][]byte, error) {
	if p.Mode == v1alpha1.ModeDisk {
		return DiskFiles(b)
	}
	ours, err := CloudConfig(b)
	if err != nil {
		return nil, err
	}
	if p.UserPart == nil {
		return map[string][]byte{v1alpha1.SecretKeyUserData: ours}, nil
	}
	merged, err := Merge(p.UserPart, ours)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{v1alpha1.SecretKeyUserData: merged}, nil
}

// UsableClient is the client a server publishes (its status.client) when a
// bootstrap can carry it, nil otherwise: a status someone else wrote never
// keeps a VM from its bootstrap, its guest then uses the kopia it has.
func UsableClient(c *v1alpha1.ClientStatus) *v1alpha1.ClientStatus {
	if c == nil {
		return nil
	}
	b := Bootstrap{Client: c}
	if b.validateClient() != nil {
		return nil
	}
	return c
}

// Schedule reads the paths and schedule a VM's annotations ask the
// bootstrap for (guestbackup.io/paths and guestbackup.io/schedule), as the
// webhook admits them; the error says what to fix.
func Schedule(annotations map[string]string) (paths []string, schedule string, err error) {
	if paths, err = ParsePaths(annotations[v1alpha1.AnnotationPaths]); err != nil {
		return nil, "", fmt.Errorf("annotation %s: %w (want absolute paths separated by commas)", v1alpha1.AnnotationPaths, err)
	}
	if schedule = annotations[v1alpha1.AnnotationSchedule]; schedule != "" {
		if err := ValidateSchedule(schedule); err != nil {
			return nil, "", fmt.Errorf("annotation %s: %w", v1alpha1.AnnotationSchedule, err)
		}
		if len(paths) == 0 {
			return nil, "", fmt.Errorf("annotation %s is set but %s is not: say what to back up", v1alpha1.AnnotationSchedule, v1alpha1.AnnotationPaths)
		}
	}
	return paths, schedule, nil
}
