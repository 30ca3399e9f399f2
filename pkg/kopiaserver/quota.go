package kopiaserver

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/units"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
)

// A per-VM quota (spec.quota) goes this way: the controller writes each
// user's quota into the users Secrets (userset.QuotasKey); each server pod
// measures what its users store, refuses the writes of those over their
// quota at its session gate, and publishes them in its StorageState; the
// controller makes that status.quota and the VMs' Events. The server pods
// enforce on their own, so a controller that is down stops no refusal.

// QuotaOf is the quota, in bytes, of the VM whose identity is user
// (<vm>@<namespace>) under spec, and whether it has one: the first
// override that names the VM, else the first that names its namespace
// only, else spec.perVM. An override without perVM lifts the bound.
func QuotaOf(spec *v1alpha1.QuotaSpec, user string) (int64, bool) {
	if spec == nil {
		return 0, false
	}
	name, namespace, _ := strings.Cut(user, "@")
	bound := func(q *v1alpha1.QuotaOverride) (int64, bool) {
		if q.PerVM == nil {
			return 0, false
		}
		return max(q.PerVM.Value(), 0), true
	}
	for i := range spec.Overrides {
		if o := &spec.Overrides[i]; o.Namespace == namespace && o.Name == name {
			return bound(o)
		}
	}
	for i := range spec.Overrides {
		if o := &spec.Overrides[i]; o.Namespace == namespace && o.Name == "" {
			return bound(o)
		}
	}
	if spec.PerVM == nil {
		return 0, false
	}
	return max(spec.PerVM.Value(), 0), true
}

// quotasOf is the quota of each of users that has one, for a users Secret.
func quotasOf[V any](spec *v1alpha1.QuotaSpec, users map[string]V) map[string]int64 {
	quotas := map[string]int64{}
	for user := range users {
		if q, ok := QuotaOf(spec, user); ok {
			quotas[user] = q
		}
	}
	return quotas
}

// quotaStatus is status.quota: from the freshest complete measurement a
// server pod published that is not stale (of two equally fresh, the first
// pod's by name, so that replicas do not take turns), else the previous
// status, with the failure a pod reports that has measured nothing yet (it
// restarted, and its first measurement failed): that says nothing of who
// is over. Nil when no user has a quota (spec.quota unset, or overrides
// that lift every bound): the pods then measure nothing, and refuse nobody.
func quotaStatus(b *v1alpha1.BackupStorageLocationServer, users UserSet, now time.Time, states map[string]maintenancestate.StorageState) *v1alpha1.QuotaStatus {
	if !anyQuota(b.Spec.Quota, users) {
		return nil
	}
	var latest *maintenancestate.QuotaState
	failure := ""
	for _, pod := range slices.Sorted(maps.Keys(states)) {
		st := states[pod]
		if st.Quota == nil || now.Sub(st.CheckedAt) > maintenancestate.StorageStale {
			continue
		}
		if st.Quota.MeasuredAt.IsZero() {
			failure = cmp.Or(failure, st.Quota.Error)
			continue
		}
		if latest == nil || st.Quota.MeasuredAt.After(latest.MeasuredAt) {
			latest = st.Quota
		}
	}
	if latest == nil {
		if failure == "" || b.Status.Quota == nil {
			return b.Status.Quota
		}
		kept := b.Status.Quota.DeepCopy()
		kept.Failure = failure
		return kept
	}
	s := &v1alpha1.QuotaStatus{
		MeasuredAt:   metaTime(latest.MeasuredAt),
		Failure:      latest.Error,
		VMsOverQuota: int32(min(latest.OverCount, 1<<31-1)), //nolint:gosec // bounded above
	}
	// In the pod's order (maintenancestate.CompareQuotaUse), bounded as
	// the CRD's maxItems.
	for _, u := range latest.Over[:min(len(latest.Over), maintenancestate.MaxListedOverQuota)] {
		name, namespace, _ := strings.Cut(u.User, "@")
		s.OverQuota = append(s.OverQuota, v1alpha1.VMQuotaUse{VM: namespace + "/" + name, UsedBytes: u.UsedBytes, QuotaBytes: u.QuotaBytes})
	}
	return s
}

// anyQuota is whether some user of users has a quota under spec.
func anyQuota(spec *v1alpha1.QuotaSpec, users UserSet) bool {
	for _, shard := range users.Shards {
		for user := range shard {
			if _, ok := QuotaOf(spec, user); ok {
				return true
			}
		}
	}
	return false
}

// quotaNotices are the Events for the VMs that went over their quota since
// before (the status the previous pass wrote), and for those back under
// it. A VM that left a truncated list may still be over: it gets none.
// server is the BSLS.
func quotaNotices(server types.NamespacedName, before, after *v1alpha1.QuotaStatus) []vmNotice {
	was := map[string]bool{}
	if before != nil {
		for _, u := range before.OverQuota {
			was[u.VM] = true
		}
	}
	is := map[string]bool{}
	var notices []vmNotice
	if after != nil {
		for _, u := range after.OverQuota {
			is[u.VM] = true
			if was[u.VM] {
				continue
			}
			notices = append(notices, vmNotice{VM: vmKey(u.VM), Event: vmevent.Warning(ReasonBackupQuotaExceeded, fmt.Sprintf(
				"This VM stores %s on BackupStorageLocationServer %s, reaching its quota of %s (measured at %s): its guest's backups are refused until it stores less. "+
					"Delete some of its snapshots in the guest (guestbackup-kopia snapshot delete; not on an append-only server), or ask the cluster admin to raise spec.quota",
				units.Bytes(uint64(max(u.UsedBytes, 0))), server, units.Bytes(uint64(max(u.QuotaBytes, 0))), measuredAt(after)))})
		}
		if int(after.VMsOverQuota) > len(after.OverQuota) {
			return notices
		}
	}
	if before == nil {
		return notices
	}
	why := "no quota bounds it any more"
	if after != nil {
		why = "it no longer reaches its quota: it stores less, or its quota was raised (measured at " + measuredAt(after) + ")"
	}
	for _, u := range before.OverQuota {
		if is[u.VM] {
			continue
		}
		notices = append(notices, vmNotice{VM: vmKey(u.VM), Event: vmevent.Normal(ReasonBackupQuotaRestored, fmt.Sprintf(
			"This VM's guest may back up to BackupStorageLocationServer %s again: %s. Its next scheduled snapshot runs as before", server, why))})
	}
	return notices
}

// vmKey is the VM named <namespace>/<name>.
func vmKey(vm string) types.NamespacedName {
	namespace, name, _ := strings.Cut(vm, "/")
	return types.NamespacedName{Namespace: namespace, Name: name}
}

// measuredAt is when s was measured, for a message.
func measuredAt(s *v1alpha1.QuotaStatus) string {
	if s.MeasuredAt == nil {
		return "an unknown time"
	}
	return timestamp(s.MeasuredAt.Time)
}
