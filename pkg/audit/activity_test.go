package audit

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
)

// TestIsServersActivity: only an activity ConfigMap its own BSLS controls
// maps to VMs; labels alone are anyone's to write.
func TestIsServersActivity(t *testing.T) {
	server := func(name string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "BackupStorageLocationServer", Name: name, UID: "u1", Controller: ptr.To(true)}
	}
	for _, tc := range []struct {
		name   string
		label  string
		owners []metav1.OwnerReference
		want   bool
	}{
		{name: "controlled by its BSLS", label: "main", owners: []metav1.OwnerReference{server("main")}, want: true},
		{name: "no activity label", owners: []metav1.OwnerReference{server("main")}},
		{name: "labelled, no owner", label: "main"},
		{name: "owned by its BSLS, not controlled", label: "main", owners: []metav1.OwnerReference{func() metav1.OwnerReference {
			r := server("main")
			r.Controller = nil
			return r
		}()}},
		{name: "controlled by another BSLS", label: "main", owners: []metav1.OwnerReference{server("other")}},
		{name: "controlled by a kind of the same name in another group", label: "main", owners: []metav1.OwnerReference{func() metav1.OwnerReference {
			r := server("main")
			r.APIVersion = "example.com/v1"
			return r
		}()}},
		{name: "controlled by another kind", label: "main", owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "main", UID: "u2", Controller: ptr.To(true)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: activity.ConfigMapName("main", 0), Namespace: "backup", OwnerReferences: tc.owners}}
			if tc.label != "" {
				cm.Labels = map[string]string{activity.Label: tc.label}
			}
			if got := IsServersActivity(cm); got != tc.want {
				t.Errorf("IsServersActivity = %v, want %v", got, tc.want)
			}
		})
	}
}
