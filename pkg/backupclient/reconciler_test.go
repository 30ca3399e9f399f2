package backupclient

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/guestbackup/guestbackup/pkg/activity"
)

// An activity ConfigMap wakes the BackupClients whose identities it lists,
// and nothing for VMs' guests or a ConfigMap that is none.
func TestClientsOfActivity(t *testing.T) {
	shard := func(labelled bool, users ...string) *corev1.ConfigMap {
		guests := map[string]activity.Guest{}
		for _, u := range users {
			guests[u] = activity.Guest{User: u, Snapshots: 1}
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main-activity-3"}, Data: map[string]string{activity.Key: string(activity.Encode(guests))}}
		if labelled {
			cm.Labels = map[string]string{activity.Label: "main"}
		}
		return cm
	}
	for _, tc := range []struct {
		name string
		cm   *corev1.ConfigMap
		want []types.NamespacedName
	}{
		{"clients and VMs", shard(true, "web@shop", "dbdump@shop.client", "db01@backup.client"), []types.NamespacedName{{Namespace: "backup", Name: "db01"}, {Namespace: "shop", Name: "dbdump"}}},
		{"VMs only", shard(true, "web@shop", "db@shop"), nil},
		{"not an activity ConfigMap", shard(false, "dbdump@shop.client"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []types.NamespacedName
			for _, r := range clientsOfActivity(t.Context(), tc.cm) {
				got = append(got, r.NamespacedName)
			}
			slices.SortFunc(got, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("clients %v, want %v", got, tc.want)
			}
		})
	}
}
