// Package maintenancestate is how the server pod tells the controller
// about the repository's maintenance and storage: the user-sync container
// writes a v1alpha1.MaintenanceStatus as JSON into the ConfigMap
// ConfigMapName, which the controller creates (the pod may only get and
// update it) and copies into the BSLS's status, and each pod its
// StorageState, which the controller makes the StorageAvailable condition. It is shared by both sides; the controller links
// no Kopia.
package maintenancestate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"

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

// SetKey writes one data key of the BSLS's state ConfigMap (ConfigMapName,
// which the controller creates and the pod's Role lets it get and update),
// keeping its other keys: the maintenance runner and the client server
// each write their own. value computes the key's new value from its
// current one (empty when unset); a write conflict reads the ConfigMap
// again and retries, so neither writer waits for its next run.
func SetKey(ctx context.Context, configMaps typedcorev1.ConfigMapInterface, bsls, key string, value func(current string) string) error {
	name := ConfigMapName(bsls)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := configMaps.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		data := value(cm.Data[key])
		if cm.Data[key] == data {
			return nil
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[key] = data
		_, err = configMaps.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("ConfigMap %s does not exist yet (the controller creates it): %w", name, err)
	}
	if err != nil {
		return fmt.Errorf("write %s into ConfigMap %s: %w", key, name, err)
	}
	return nil
}

// storageKeyPrefix starts the keys under which each server pod says
// whether it reaches the repository's storage (StorageKey).
const storageKeyPrefix = "storage."

// StorageKey is the data key under which server pod pod publishes its
// StorageState: one key per pod, so that replicas never overwrite each
// other.
func StorageKey(pod string) string { return storageKeyPrefix + pod }

// StorageState is what a server pod last found of the repository's
// storage: whether its last check reached it, the storage's own error when
// not, since when that is so, and when it last said so. A pod says it again
// every StorageHeartbeat, so that the state of a pod that is gone grows
// stale (StorageStale) rather than speaking for it.
type StorageState struct {
	Available bool      `json:"available"`
	Error     string    `json:"error,omitempty"`
	Since     time.Time `json:"since"`
	CheckedAt time.Time `json:"checkedAt"`
}

// StorageHeartbeat is how often a server pod publishes its StorageState
// when nothing changed; StorageStale is when the controller stops counting
// a state that was not published again; StorageForgotten is when the controller removes the state of a pod that
// stopped publishing it.
const (
	StorageHeartbeat = time.Minute
	StorageStale     = 3 * StorageHeartbeat
	StorageForgotten = 10 * StorageHeartbeat
)

// EncodeStorage renders s for the ConfigMap.
func EncodeStorage(s StorageState) string {
	data, _ := json.Marshal(s) // plain data: cannot fail
	return string(data)
}

// StorageStates reads the StorageState of each pod from a state
// ConfigMap's data, by pod name; a value that does not parse is skipped.
func StorageStates(data map[string]string) map[string]StorageState {
	states := map[string]StorageState{}
	for key, value := range data {
		pod, ok := strings.CutPrefix(key, storageKeyPrefix)
		if !ok {
			continue
		}
		var s StorageState
		if json.Unmarshal([]byte(value), &s) == nil {
			states[pod] = s
		}
	}
	return states
}
