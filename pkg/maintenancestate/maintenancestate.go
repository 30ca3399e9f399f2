// Package maintenancestate is how the server pod tells the controller
// about the repository's maintenance: the user-sync container writes a
// v1alpha1.MaintenanceStatus as JSON into the ConfigMap ConfigMapName, which
// the controller creates (the pod may only get and update it) and copies
// into the BSLS's status. It is shared by both sides; the controller links
// no Kopia.
package maintenancestate

import (
	"encoding/json"
	"fmt"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// Key is the data key of the ConfigMap.
const Key = "maintenance"

// ConfigMapName is a BSLS's maintenance ConfigMap.
func ConfigMapName(bslsName string) string { return bslsName + "-maintenance" }

// Encode renders s for the ConfigMap.
func Encode(s v1alpha1.MaintenanceStatus) string {
	data, _ := json.Marshal(s) // plain data: cannot fail
	return string(data)
}

// Decode reads what Encode wrote; "" is nothing reported yet.
func Decode(data string) (*v1alpha1.MaintenanceStatus, error) {
	if data == "" {
		return nil, nil
	}
	s := &v1alpha1.MaintenanceStatus{}
	if err := json.Unmarshal([]byte(data), s); err != nil {
		return nil, fmt.Errorf("maintenance ConfigMap, key %s: %w", Key, err)
	}
	return s, nil
}

// LeaseName is the coordination.k8s.io Lease a BSLS's server pods elect the
// one that runs maintenance with, when the BSLS runs several. The
// controller creates it (a pod's Role may get and update that name only,
// never create Leases).
func LeaseName(bslsName string) string { return bslsName + "-maintenance" }
