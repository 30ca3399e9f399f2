package kopiaserver

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// Several server pods never run maintenance at once: none runs it, and the
// status says why instead of showing a schedule nobody keeps.
func TestMaintenanceStatus(t *testing.T) {
	published := &v1alpha1.MaintenanceStatus{Owner: "guestbackup-maintenance@main.backup", LastCycle: "full", LastRun: &metav1.Time{}}
	for name, tc := range map[string]struct {
		replicas *int32
		disabled bool
		failure  string
	}{
		"default replicas":     {nil, false, ""},
		"one replica":          {ptr.To[int32](1), false, ""},
		"two replicas":         {ptr.To[int32](2), false, "spec.replicas is 2"},
		"two, maintenance off": {ptr.To[int32](2), true, ""},
	} {
		t.Run(name, func(t *testing.T) {
			b := &v1alpha1.BackupStorageLocationServer{}
			b.Spec.Replicas = tc.replicas
			if tc.disabled {
				b.Spec.Repository.Maintenance = &v1alpha1.MaintenanceSpec{Disabled: true}
			}
			got := maintenanceStatus(b, published.DeepCopy())
			if tc.failure == "" {
				if got.Failure != "" {
					t.Errorf("failure %q, want none", got.Failure)
				}
				return
			}
			if !strings.Contains(got.Failure, tc.failure) || got.Owner != published.Owner {
				t.Errorf("got %+v, want the published status with a failure naming %q", got, tc.failure)
			}
		})
	}
}
