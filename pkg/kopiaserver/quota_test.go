package kopiaserver

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

func quantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// The admin's overrides come first, the VM's before its namespace's, then
// the default; an override without a bound lifts it.
func TestQuotaOf(t *testing.T) {
	spec := &v1alpha1.QuotaSpec{
		PerVM: quantity("10Gi"),
		Overrides: []v1alpha1.QuotaOverride{
			{Namespace: "team-a", PerVM: quantity("20Gi")},
			{Namespace: "team-a", Name: "db", PerVM: quantity("100Gi")},
			{Namespace: "team-a", Name: "db", PerVM: quantity("1Gi")}, // a later duplicate: ignored
			{Namespace: "lab", Name: "scratch"},                       // no bound
			{Namespace: "frozen", PerVM: quantity("0")},
		},
	}
	for _, tc := range []struct {
		spec  *v1alpha1.QuotaSpec
		user  string
		want  int64
		bound bool
	}{
		{spec: nil, user: "web@team-a"},
		{spec: &v1alpha1.QuotaSpec{}, user: "web@team-a"},
		{spec: spec, user: "web@team-b", want: 10 << 30, bound: true},
		{spec: spec, user: "web@team-a", want: 20 << 30, bound: true},
		{spec: spec, user: "db@team-a", want: 100 << 30, bound: true},
		{spec: spec, user: "db@team-b", want: 10 << 30, bound: true},
		{spec: spec, user: "scratch@lab"},
		{spec: spec, user: "other@lab", want: 10 << 30, bound: true},
		{spec: spec, user: "vm@frozen", want: 0, bound: true},
		{spec: &v1alpha1.QuotaSpec{Overrides: []v1alpha1.QuotaOverride{{Namespace: "team-a", PerVM: quantity("1Mi")}}}, user: "web@team-b"},
	} {
		got, bound := QuotaOf(tc.spec, tc.user)
		if got != tc.want || bound != tc.bound {
			t.Errorf("QuotaOf(%v, %s) = %d, %v; want %d, %v", tc.spec, tc.user, got, bound, tc.want, tc.bound)
		}
	}
}

func quotaState(at time.Time, count int, over ...maintenancestate.QuotaUse) *maintenancestate.QuotaState {
	return &maintenancestate.QuotaState{MeasuredAt: at, OverCount: count, Over: over}
}

// status.quota follows the freshest measurement of a pod that still
// speaks, and keeps what it had while none published one.
func TestQuotaStatus(t *testing.T) {
	now := decideNow
	b := &v1alpha1.BackupStorageLocationServer{Spec: v1alpha1.BackupStorageLocationServerSpec{Quota: &v1alpha1.QuotaSpec{PerVM: quantity("1Gi")}}}
	var users UserSet
	for _, u := range []string{"web@team-a", "db@team-a"} {
		shard := userset.ShardOf(u)
		if users.Shards[shard] == nil {
			users.Shards[shard] = map[string]identity.Hash{}
		}
		users.Shards[shard][u] = identity.Hash{}
	}
	web := maintenancestate.QuotaUse{User: "web@team-a", UsedBytes: 3 << 30, QuotaBytes: 1 << 30}
	db := maintenancestate.QuotaUse{User: "db@team-a", UsedBytes: 2 << 30, QuotaBytes: 1 << 30}
	fresh := func(q *maintenancestate.QuotaState) maintenancestate.StorageState {
		return maintenancestate.StorageState{CheckedAt: now.Add(-time.Minute), Quota: q}
	}
	stale := maintenancestate.StorageState{CheckedAt: now.Add(-time.Hour), Quota: quotaState(now.Add(-time.Minute), 1, web)}

	got := quotaStatus(b, users, now, map[string]maintenancestate.StorageState{
		"pod-a": fresh(quotaState(now.Add(-10*time.Minute), 1, db)),
		"pod-b": fresh(quotaState(now.Add(-5*time.Minute), 2, web, db)),
		"pod-c": stale,
	})
	if got == nil || !got.MeasuredAt.Time.Equal(now.Add(-5*time.Minute)) || got.VMsOverQuota != 2 || len(got.OverQuota) != 2 ||
		got.OverQuota[0].VM != "team-a/web" || got.OverQuota[1].VM != "team-a/db" {
		t.Fatalf("quotaStatus = %+v; want pod-b's measurement, in its order", got)
	}

	b.Status.Quota = got
	if kept := quotaStatus(b, users, now, map[string]maintenancestate.StorageState{"pod-c": stale, "pod-d": fresh(nil)}); kept != got {
		t.Errorf("no fresh measurement: %+v, want the previous status kept", kept)
	}
	failed := &maintenancestate.QuotaState{Error: "storage does not answer"}
	kept := quotaStatus(b, users, now, map[string]maintenancestate.StorageState{"pod-d": fresh(failed)})
	if kept == nil || kept.Failure != "storage does not answer" || kept.VMsOverQuota != 2 || len(kept.OverQuota) != 2 {
		t.Errorf("a restarted pod whose first measurement failed: %+v, want the previous list kept, with the failure", kept)
	}
	if b.Status.Quota.Failure != "" {
		t.Error("the previous status was changed in place")
	}
	tie := map[string]maintenancestate.StorageState{
		"pod-b": fresh(quotaState(now.Add(-time.Minute), 1, web)),
		"pod-a": fresh(quotaState(now.Add(-time.Minute), 1, db)),
	}
	for range 20 {
		if s := quotaStatus(b, users, now, tie); s.OverQuota[0].VM != "team-a/db" {
			t.Fatalf("equally fresh measurements: %+v, want pod-a's, every time", s)
		}
	}
	b.Spec.Quota.Overrides = []v1alpha1.QuotaOverride{{Namespace: "team-a"}}
	if lifted := quotaStatus(b, users, now, map[string]maintenancestate.StorageState{"pod-b": fresh(quotaState(now, 1, web))}); lifted != nil {
		t.Errorf("every user's bound lifted by an override: %+v, want none", lifted)
	}
	b.Spec.Quota = nil
	if lifted := quotaStatus(b, users, now, map[string]maintenancestate.StorageState{"pod-b": fresh(quotaState(now, 1, web))}); lifted != nil {
		t.Errorf("spec.quota unset: %+v, want none", lifted)
	}
}

// A VM's owner hears when its backups start being refused and when they
// resume, once each.
func TestQuotaNotices(t *testing.T) {
	server := types.NamespacedName{Namespace: "backup", Name: "main"}
	at := &metav1.Time{Time: decideNow}
	web := v1alpha1.VMQuotaUse{VM: "team-a/web", UsedBytes: 3 << 30, QuotaBytes: 1 << 30}
	db := v1alpha1.VMQuotaUse{VM: "team-a/db", UsedBytes: 1 << 30, QuotaBytes: 1 << 30}
	status := func(count int32, over ...v1alpha1.VMQuotaUse) *v1alpha1.QuotaStatus {
		return &v1alpha1.QuotaStatus{MeasuredAt: at, VMsOverQuota: count, OverQuota: over}
	}
	for _, tc := range []struct {
		name          string
		before, after *v1alpha1.QuotaStatus
		want          []string
	}{
		{name: "nothing measured", before: nil, after: nil},
		{name: "a VM goes over", before: status(0), after: status(1, web), want: []string{
			"Warning BackupQuotaExceeded team-a/web: This VM stores 3.0 GiB on BackupStorageLocationServer backup/main, reaching its quota of 1.0 GiB (measured at " + decideNow.Format(time.RFC3339) + "): its guest's backups are refused",
		}},
		{name: "still over: said once", before: status(1, web), after: status(1, web)},
		{name: "another reaches its quota", before: status(1, web), after: status(2, web, db), want: []string{
			"Warning BackupQuotaExceeded team-a/db: This VM stores 1.0 GiB",
		}},
		{name: "back under", before: status(2, web, db), after: status(1, web), want: []string{
			"Normal BackupQuotaRestored team-a/db: This VM's guest may back up to BackupStorageLocationServer backup/main again: it no longer reaches its quota: it stores less, or its quota was raised (measured at " + decideNow.Format(time.RFC3339) + "). Its next scheduled snapshot runs as before",
		}},
		{name: "a VM that left a truncated list may still be over", before: status(2, web, db), after: status(300, web)},
		{name: "no quota left", before: status(1, web), after: nil, want: []string{
			"Normal BackupQuotaRestored team-a/web: This VM's guest may back up to BackupStorageLocationServer backup/main again: no quota bounds it any more. Its next scheduled snapshot runs as before",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectNotices(t, quotaNotices(server, tc.before, tc.after), tc.want)
		})
	}
}

// The bound the controller keeps of status.quota.overQuota is the CRD's.
func TestQuotaBoundMatchesCRD(t *testing.T) {
	over := statusSchema(t).Properties["quota"].Properties["overQuota"]
	if over.MaxItems == nil || *over.MaxItems != maintenancestate.MaxListedOverQuota {
		t.Errorf("status.quota.overQuota: maxItems %v, want %d (maintenancestate)", over.MaxItems, maintenancestate.MaxListedOverQuota)
	}
}
