package audit

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"github.com/guestbackup/guestbackup/pkg/activity"
)

// TestVMSeries: what is exported of a VM after each of a sequence of
// reconciles, in Prometheus' text format.
func TestVMSeries(t *testing.T) {
	web := types.NamespacedName{Namespace: "team-a", Name: "web"}
	end := time.Unix(1_800_000_000, 0)
	snapshotted := &activity.Guest{Snapshots: 3, Last: activity.Snapshot{ID: "k1", End: end, Bytes: 6000}}
	type step struct {
		set          bool // else forget
		bsls         string
		notConnected bool
		guest        *activity.Guest
	}
	header := `
# HELP guestbackup_vm_guest_not_connected 1 while a running VM's guest has not connected within the controller's --guest-not-connected-after of its start (the GuestNotConnected Event), else 0.
# TYPE guestbackup_vm_guest_not_connected gauge
`
	// snapshottedSeries is what is exported of web on backup/main once
	// snapshotted.
	snapshottedSeries := `guestbackup_vm_guest_not_connected{bsls="backup/main",namespace="team-a",vm="web"} 0
# HELP guestbackup_vm_last_snapshot_bytes Size of the files in a VM's newest snapshot.
# TYPE guestbackup_vm_last_snapshot_bytes gauge
guestbackup_vm_last_snapshot_bytes{bsls="backup/main",namespace="team-a",vm="web"} 6000
# HELP guestbackup_vm_last_snapshot_timestamp_seconds When a VM's newest snapshot ended (Unix time).
# TYPE guestbackup_vm_last_snapshot_timestamp_seconds gauge
guestbackup_vm_last_snapshot_timestamp_seconds{bsls="backup/main",namespace="team-a",vm="web"} 1.8e+09
# HELP guestbackup_vm_snapshots Snapshots a VM has in its server's repository.
# TYPE guestbackup_vm_snapshots gauge
guestbackup_vm_snapshots{bsls="backup/main",namespace="team-a",vm="web"} 3
`
	tests := []struct {
		name  string
		steps []step
		want  string
	}{{
		name:  "a guest never seen: not connected, nothing else",
		steps: []step{{set: true, bsls: "backup/main", notConnected: true}},
		want:  header + `guestbackup_vm_guest_not_connected{bsls="backup/main",namespace="team-a",vm="web"} 1` + "\n",
	}, {
		name:  "a guest that snapshotted",
		steps: []step{{set: true, bsls: "backup/main", guest: snapshotted}},
		want:  header + snapshottedSeries,
	}, {
		name:  "its server no longer publishes it: the last snapshot stays, so that staleness alerts",
		steps: []step{{set: true, bsls: "backup/main", guest: snapshotted}, {set: true, bsls: "backup/main"}},
		want:  header + snapshottedSeries,
	}, {
		name:  "moved to another server: the old server's series are gone",
		steps: []step{{set: true, bsls: "backup/main", guest: snapshotted}, {set: true, bsls: "backup/other", notConnected: true}},
		want:  header + `guestbackup_vm_guest_not_connected{bsls="backup/other",namespace="team-a",vm="web"} 1` + "\n",
	}, {
		name:  "deleted or opted out: nothing",
		steps: []step{{set: true, bsls: "backup/main", guest: snapshotted}, {}},
		want:  "",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &vmSeries{vms: map[types.NamespacedName]guestSeries{}}
			for _, st := range tt.steps {
				if st.set {
					s.set(web, st.bsls, st.notConnected, st.guest)
				} else {
					s.forget(web)
				}
			}
			if err := testutil.CollectAndCompare(s, strings.NewReader(tt.want)); err != nil {
				t.Error(err)
			}
		})
	}
}
