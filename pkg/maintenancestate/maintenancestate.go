// Package maintenancestate is how the server pod tells the controller
// about the repository's maintenance and storage: the user-sync container
// writes a v1alpha1.MaintenanceStatus as JSON into the ConfigMap
// ConfigMapName, which the controller creates (the pod may only get and
// update it) and copies into the BSLS's status, and each pod its
// StorageState, which the controller makes the StorageAvailable and
// StorageSpace conditions. It is shared by both sides; the controller
// links no Kopia.
package maintenancestate

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
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
// not, since when that is so, and when it last said so; how much space it
// has, where the storage can tell; and the last of the pod's writes it
// refused for want of space. A pod says it again every StorageHeartbeat,
// so that the state of a pod that is gone grows stale (StorageStale)
// rather than speaking for it.
type StorageState struct {
	Available bool      `json:"available"`
	Error     string    `json:"error,omitempty"`
	Since     time.Time `json:"since"`
	CheckedAt time.Time `json:"checkedAt"`
	// Space is what the storage's filesystem had at the check; nil: not
	// measured (storage that cannot tell, such as an S3 bucket, or a pod
	// of a guestbackup older than the field).
	Space *StorageSpace `json:"space,omitempty"`
	// Refused is the storage's error of each of the pod's writers (user
	// sync, maintenance) whose last write it refused for want of space
	// (package storagespace), as "<writer>: <error>; ...", and RefusedAt
	// since when; empty once a later attempt of each succeeded, or the
	// volume gained 1% of its capacity since.
	Refused   string    `json:"refused,omitempty"`
	RefusedAt time.Time `json:"refusedAt,omitzero"`
	// UsersNotApplied is why the pod's last user sync could not apply the
	// users Secrets to the repository (a full or failing storage), empty
	// once one did: users added since cannot log in through this pod
	// yet, while its session gate enforces removals and new passwords.
	UsersNotApplied string `json:"usersNotApplied,omitempty"`
	// Quota is the pod's last measurement of what its users store against
	// their quotas; nil before one, or when no user has a quota.
	Quota *QuotaState `json:"quota,omitempty"`
}

// MaxListedOverQuota bounds the users a QuotaState lists, so that the
// ConfigMap holds one per pod whatever the users do: the count stays exact.
const MaxListedOverQuota = 100

// QuotaState is what a server pod's last measurement of its users' usage
// found (package usage): the users that store more than their quota, whose
// writes its session gate refuses. The controller makes it status.quota
// and the BackupQuotaExceeded and BackupQuotaRestored Events of the VMs.
type QuotaState struct {
	// MeasuredAt is when the last complete measurement ended.
	MeasuredAt time.Time `json:"measuredAt"`
	// Error is why the last measurement could not complete; Over is then
	// the last complete one's.
	Error string `json:"error,omitempty"`
	// OverCount is how many users are over their quota; Over lists them,
	// the most over (by the share of their quota) first, at most
	// MaxListedOverQuota.
	OverCount int        `json:"overCount"`
	Over      []QuotaUse `json:"over,omitempty"`
}

// QuotaUse is what one user (user@host) stores against its quota.
type QuotaUse struct {
	User       string `json:"user"`
	UsedBytes  int64  `json:"usedBytes"`
	QuotaBytes int64  `json:"quotaBytes"`
}

// Share is how far u is over its quota, as a fraction of it: infinite for
// a quota of 0, which every user reaches.
func (u QuotaUse) Share() float64 {
	if u.QuotaBytes <= 0 {
		return math.Inf(1)
	}
	return float64(u.UsedBytes) / float64(u.QuotaBytes)
}

// CompareQuotaUse orders the users over their quota as a QuotaState lists
// them: the most over (by Share, then by bytes) first, then by name, so
// that every pod lists the same users in the same order.
func CompareQuotaUse(a, b QuotaUse) int {
	return cmp.Or(cmp.Compare(b.Share(), a.Share()), cmp.Compare(b.UsedBytes, a.UsedBytes), strings.Compare(a.User, b.User))
}

// StorageSpace is a filesystem's space, as statfs says: FreeBytes is what
// an unprivileged writer such as Kopia may still write (df's Available),
// CapacityBytes its size.
type StorageSpace struct {
	FreeBytes     uint64 `json:"freeBytes"`
	CapacityBytes uint64 `json:"capacityBytes"`
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

// IntegrityKey is the data key under which the server pod that runs
// maintenance publishes its IntegrityState.
const IntegrityKey = "integrity"

// Bounds on what an IntegrityState lists, so that the ConfigMap (at most
// 1 MiB) holds it whatever the storage lost: counts stay exact.
const (
	MaxListedPacks     = 20
	MaxListedSources   = 1000
	MaxListedSnapshots = 3
)

// IntegrityState is what the last verification pass found of the
// repository: whether every content the index names is in a pack the
// storage still holds, whether the packs it read back decrypted, and which
// snapshots reference what was lost. The controller makes it the
// RepositoryIntact condition, status.integrity and the BackupDamaged Events
// of the VMs that own a damaged snapshot.
type IntegrityState struct {
	// CheckedAt is when the last pass ended, whatever its outcome.
	CheckedAt time.Time `json:"checkedAt"`
	// Error is why the last pass could not complete (the storage did not
	// answer, say); its other fields then are the last complete pass's.
	Error string `json:"error,omitempty"`
	// VerifiedAt is when the last complete pass ended; zero before one did.
	VerifiedAt time.Time `json:"verifiedAt,omitzero"`
	// Contents and Packs are how many contents the index names, and in how
	// many packs, that the last complete pass found present.
	Contents int `json:"contents"`
	Packs    int `json:"packs"`
	// ReadPacks and ReadBytes are how many packs, of how many bytes, the
	// last complete pass read back and decrypted, content by content.
	ReadPacks int   `json:"readPacks"`
	ReadBytes int64 `json:"readBytes"`
	// MissingPacks are packs the index names that the storage no longer
	// has, and DamagedPacks packs holding a content that did not read back
	// (at most MaxListedPacks each, of the last pass that found any).
	MissingPacks []string `json:"missingPacks,omitempty"`
	DamagedPacks []string `json:"damagedPacks,omitempty"`
	// LostContents is how many contents that pass found lost. They are
	// dropped from the index, so that the next snapshot of the same data
	// uploads them again.
	LostContents int `json:"lostContents,omitempty"`
	// Pending is how many lost contents are still in the index, marked
	// deleted, because contents Kopia's garbage collection deleted
	// recently keep the deletion watermark from moving past them; a
	// guest's client takes them for present and does not upload them
	// until Kopia's maintenance lets go of those (at most its safety
	// margins, a day or two).
	Pending int `json:"pending,omitempty"`
	// DamagedSnapshots is how many snapshots reference a lost content,
	// and Damaged the sources they are of (at most MaxListedSources, the
	// most recent first), while they do.
	DamagedSnapshots int             `json:"damagedSnapshots,omitempty"`
	Damaged          []DamagedSource `json:"damaged,omitempty"`
	// Settled are the sources whose damaged snapshots this pass found
	// could no longer heal (their guest's latest snapshot is whole, or the
	// repository has been damaged for a week) and rewrote, each lost file
	// replaced by a stub, `.INVALID.<name>`, that names what was lost, so
	// that they restore what remains and Kopia's garbage collection,
	// which fails on a reference to lost data, runs again. Listed by the
	// pass that settled them only; their counts are of before.
	Settled []DamagedSource `json:"settled,omitempty"`
	// DamagedSince is when the repository was last found damaged after
	// being intact; zero while no snapshot is damaged.
	DamagedSince time.Time `json:"damagedSince,omitzero"`
}

// DamagedSource is one backed-up path of one guest with snapshots that
// cannot be restored whole.
type DamagedSource struct {
	// User and Host are the guest's Kopia identity: for a VM, its name and
	// its namespace (identity.OfVM).
	User string `json:"user"`
	Host string `json:"host"`
	Path string `json:"path"`
	// Snapshots is how many of the source's snapshots are damaged, and
	// Files how many files they miss data of, counted once per file
	// object.
	Snapshots int `json:"snapshots"`
	Files     int `json:"files"`
	// Oldest and Newest are the start times of the first and the last
	// damaged snapshot; IDs lists up to MaxListedSnapshots of the most
	// recent damaged snapshots' IDs.
	Oldest time.Time `json:"oldest"`
	Newest time.Time `json:"newest"`
	IDs    []string  `json:"ids,omitempty"`
	// Healing is true while the source's latest snapshot is damaged: its
	// guest re-reads every file at its next snapshot (the client learns it
	// from the repository), which uploads again what was lost.
	Healing bool `json:"healing,omitempty"`
}

// EncodeIntegrity renders s for the ConfigMap.
func EncodeIntegrity(s IntegrityState) string {
	data, _ := json.Marshal(s) // plain data: cannot fail
	return string(data)
}

// DecodeIntegrity reads what EncodeIntegrity wrote; "" is nothing
// published yet.
func DecodeIntegrity(data string) (*IntegrityState, error) {
	if data == "" {
		return nil, nil
	}
	s := &IntegrityState{}
	if err := json.Unmarshal([]byte(data), s); err != nil {
		return nil, fmt.Errorf("state ConfigMap, key %s: %w", IntegrityKey, err)
	}
	return s, nil
}
