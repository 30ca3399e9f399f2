package vmsecret

import (
	"encoding/json"
	"fmt"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// ParseStatus reads the status annotation the webhook writes on a VM
// (v1alpha1.AnnotationStatus): what it injected, and so what the VM's
// Secret holds (its mode, generation, the volume that reads it, whether the
// owner's user-data was merged into it). false when the VM has none; an
// error when it is not what the webhook writes, which always names the
// Secret and the volume: the webhook denies such a VM, and the controller
// renders nothing by it.
func ParseStatus(annotations map[string]string) (v1alpha1.InjectionStatus, bool, error) {
	var st v1alpha1.InjectionStatus
	value, ok := annotations[v1alpha1.AnnotationStatus]
	if !ok {
		return st, false, nil
	}
	if err := json.Unmarshal([]byte(value), &st); err != nil || st.Volume == "" || st.Secret == "" {
		return st, false, fmt.Errorf("annotation %s is not what guestbackup wrote (it is managed by the webhook): remove it and admit the VM again", v1alpha1.AnnotationStatus)
	}
	return st, true, nil
}
