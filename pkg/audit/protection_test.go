package audit

import (
	"fmt"
	"slices"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
)

func TestProtectionStatus(t *testing.T) {
	now := time.Date(2026, 12, 7, 5, 0, 0, 123456789, time.UTC)
	end := now.Add(-time.Hour)
	guest := &activity.Guest{
		User: "web@team-a", Snapshots: 3, First: now.Add(-72 * time.Hour),
		Last: activity.Snapshot{ID: "k1", Path: "/srv/data", Start: end.Add(-time.Minute), End: end, Bytes: 6000, Files: 1},
	}
	type conds struct{ connected, fresh metav1.ConditionStatus }
	tests := []struct {
		name          string
		guest         *activity.Guest
		notConnected  bool
		stale         bool
		want          conds
		wantSnapshots int32
	}{
		{name: "nothing yet", want: conds{metav1.ConditionUnknown, metav1.ConditionUnknown}},
		{name: "a running VM whose guest never connected", notConnected: true, want: conds{metav1.ConditionFalse, metav1.ConditionUnknown}},
		{name: "no snapshot within the window", stale: true, want: conds{metav1.ConditionUnknown, metav1.ConditionFalse}},
		{name: "snapshots within the schedule", guest: guest, want: conds{metav1.ConditionTrue, metav1.ConditionTrue}, wantSnapshots: 3},
		{name: "snapshots, the newest too old", guest: guest, stale: true, want: conds{metav1.ConditionTrue, metav1.ConditionFalse}, wantSnapshots: 3},
		{name: "activity without a snapshot (a report only)", guest: &activity.Guest{User: "web@team-a", Report: &activity.Report{Kind: "x"}}, want: conds{metav1.ConditionUnknown, metav1.ConditionUnknown}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ProtectionStatus(ProtectionInputs{Server: "backup/main", Identity: "web@team-a", Guest: tt.guest, NotConnected: tt.notConnected, Stale: tt.stale, Now: now})
			c := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionGuestConnected)
			f := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionBackupFresh)
			if c == nil || f == nil {
				t.Fatalf("conditions %v: want GuestConnected and BackupFresh", got.Conditions)
			}
			if (conds{c.Status, f.Status}) != tt.want {
				t.Errorf("GuestConnected %s (%s), BackupFresh %s (%s); want %s, %s", c.Status, c.Message, f.Status, f.Message, tt.want.connected, tt.want.fresh)
			}
			if got.Snapshots != tt.wantSnapshots || got.Server != "backup/main" || got.Identity != "web@team-a" {
				t.Errorf("snapshots %d server %q identity %q", got.Snapshots, got.Server, got.Identity)
			}
			if tt.wantSnapshots > 0 && (got.LastSnapshot == nil || got.LastSnapshot.ID != "k1" || got.LastSnapshot.Bytes != 6000 || got.FirstSnapshotTime == nil) {
				t.Errorf("last snapshot %+v, first %v: want k1 of 6000 bytes and the first's time", got.LastSnapshot, got.FirstSnapshotTime)
			}
		})
	}
}

// The catalogue is the server's, in its order, as the API server keeps
// its times; a longer one than the API admits is cut to the newest.
func TestProtectionStatusCatalogue(t *testing.T) {
	now := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	var recent []activity.Snapshot
	for i := range v1alpha1.MaxRecentSnapshots + 2 {
		end := now.Add(-time.Duration(i)*time.Hour + 300*time.Millisecond)
		recent = append(recent, activity.Snapshot{ID: fmt.Sprintf("k%d", i), Path: "/srv", Start: end.Add(-time.Minute), End: end, Bytes: int64(i), Files: 1})
	}
	tests := []struct {
		name   string
		recent []activity.Snapshot
		want   []string
	}{
		{name: "none published", want: nil},
		{name: "two", recent: recent[:2], want: []string{"k0", "k1"}},
		{name: "more than the API admits", recent: recent, want: []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ProtectionStatus(ProtectionInputs{Server: "backup/main", Identity: "web@team-a", Recent: tt.recent, Now: now})
			var ids []string
			for _, s := range got.RecentSnapshots {
				ids = append(ids, s.ID)
				if s.EndTime.Nanosecond() != 0 || s.StartTime.Nanosecond() != 0 || s.Path != "/srv" {
					t.Errorf("%+v: want whole seconds and the path", s)
				}
			}
			if !slices.Equal(ids, tt.want) {
				t.Errorf("recent snapshots %v, want %v", ids, tt.want)
			}
		})
	}
}

// A status decided again from the same facts, against what the API server
// stored of the first (whole seconds), is equal: nothing is written when
// nothing changed, and a condition keeps its transition time.
func TestProtectionStatusIsStable(t *testing.T) {
	now := time.Date(2026, 12, 7, 5, 0, 0, 987654321, time.UTC)
	guest := &activity.Guest{User: "web@team-a", Snapshots: 1, First: now.Add(-time.Hour), Last: activity.Snapshot{ID: "k1", Path: "/srv", Start: now.Add(-time.Hour), End: now.Add(-59 * time.Minute)}}
	first := ProtectionStatus(ProtectionInputs{Server: "backup/main", Identity: "web@team-a", Guest: guest, Now: now})
	again := ProtectionStatus(ProtectionInputs{Server: "backup/main", Identity: "web@team-a", Guest: guest, Now: now.Add(time.Hour), Current: first})
	if !apiequality.Semantic.DeepEqual(first, again) {
		t.Fatalf("decided again from the same facts:\n%+v\nwant\n%+v", again, first)
	}
	if got := first.LastSnapshot.EndTime.Time; got.Nanosecond() != 0 {
		t.Errorf("end time %v keeps a fraction of a second the API server would drop", got)
	}
}
