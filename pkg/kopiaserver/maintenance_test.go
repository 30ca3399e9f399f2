package kopiaserver

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// Every server pod may run maintenance; with several, the user-sync
// container runs it only while it holds the BSLS's Lease, which it may get
// and update through the ClusterRole the controller binds, never through
// its Role.
func TestMaintenanceElection(t *testing.T) {
	for name, tc := range map[string]struct {
		replicas        *int32
		disabled        bool
		maintain, elect bool
	}{
		"default replicas":     {nil, false, true, false},
		"one replica":          {ptr.To[int32](1), false, true, false},
		"two replicas":         {ptr.To[int32](2), false, true, true},
		"two, maintenance off": {ptr.To[int32](2), true, false, true},
	} {
		t.Run(name, func(t *testing.T) {
			b := &v1alpha1.BackupStorageLocationServer{}
			b.Name, b.Namespace = "main", "backup"
			b.Spec.Storage.Filesystem = &v1alpha1.FilesystemStorage{}
			b.Spec.Replicas = tc.replicas
			if tc.disabled {
				b.Spec.Repository.Maintenance = &v1alpha1.MaintenanceSpec{Disabled: true}
			}
			d, err := Deployment(b, WorkloadInputs{Image: "guestbackup:test", TLSChecksum: "x"})
			if err != nil {
				t.Fatal(err)
			}
			sync := d.Spec.Template.Spec.Containers[1]
			if got := slices.Contains(sync.Args, "--maintenance=true"); got != tc.maintain {
				t.Errorf("--maintenance=true in %v: %v, want %v", sync.Args, got, tc.maintain)
			}
			if got := slices.Contains(sync.Args, "--maintenance-lease=main-maintenance"); got != tc.elect {
				t.Errorf("--maintenance-lease in %v: %v, want %v", sync.Args, got, tc.elect)
			}
			podName := slices.ContainsFunc(sync.Env, func(e corev1.EnvVar) bool {
				return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
			})
			if !podName {
				// Its identity in the Lease, and the key of its storage
				// state, however many replicas.
				t.Errorf("POD_NAME from metadata.name: missing from %v", sync.Env)
			}
			// The Lease comes with the ClusterRole the controller binds
			// (MaintenanceRoleBinding): the controller could write no Role
			// that grants it.
			_, role, _ := ServerRole(b)
			if slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "leases") }) {
				t.Errorf("the Role grants Leases: %+v", role.Rules)
			}
		})
	}
}

// A ReadWriteMany claim is shared by any number of pods; any other only
// by one.
func TestClaimShared(t *testing.T) {
	for name, tc := range map[string]struct {
		replicas *int32
		modes    []corev1.PersistentVolumeAccessMode
		problem  bool
	}{
		"one pod, ReadWriteOnce":      {nil, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, false},
		"two pods, ReadWriteOnce":     {ptr.To[int32](2), []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, true},
		"two pods, ReadWriteOncePod":  {ptr.To[int32](2), []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}, true},
		"two pods, ReadWriteMany":     {ptr.To[int32](2), []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteMany}, false},
		"four pods, no modes (bound)": {ptr.To[int32](4), nil, true},
	} {
		t.Run(name, func(t *testing.T) {
			b := &v1alpha1.BackupStorageLocationServer{}
			b.Spec.Replicas = tc.replicas
			pvc := &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{AccessModes: tc.modes}}
			if got := claimShared(b, pvc); (got != nil) != tc.problem {
				t.Errorf("claimShared = %+v, want a problem: %v", got, tc.problem)
			}
			if want := map[bool]corev1.PersistentVolumeAccessMode{false: corev1.ReadWriteOnce, true: corev1.ReadWriteMany}[SharesMaintenance(b)]; claimAccessMode(b) != want {
				t.Errorf("a claim the controller creates is %s, want %s", claimAccessMode(b), want)
			}
		})
	}
}

// The state ConfigMap does not grow with every server pod that ever ran:
// the storage state of a pod that stopped publishing it for
// maintenancestate.StorageForgotten is removed, and no longer counts.
func TestStorageStatesOfGonePodsAreForgotten(t *testing.T) {
	now := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	state := func(checked time.Time) string {
		return maintenancestate.EncodeStorage(maintenancestate.StorageState{Available: true, Since: checked, CheckedAt: checked})
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: maintenancestate.ConfigMapName("main"), Namespace: "backup"},
		Data: map[string]string{
			maintenancestate.Key:                   "{}",
			maintenancestate.StorageKey("current"): state(now.Add(-time.Minute)),
			maintenancestate.StorageKey("gone"):    state(now.Add(-maintenancestate.StorageForgotten - time.Second)),
		},
	}
	c := fake.NewClientBuilder().WithObjects(cm.DeepCopy()).Build()
	r := &Reconciler{Client: c, Clock: clocktesting.NewFakePassiveClock(now)}
	live := &corev1.ConfigMap{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(cm), live); err != nil {
		t.Fatal(err)
	}
	states := maintenancestate.StorageStates(live.Data)
	if err := r.forgetGonePods(context.Background(), live, states); err != nil {
		t.Fatal(err)
	}
	if _, ok := states["gone"]; ok || len(states) != 1 {
		t.Errorf("states %v: want the current pod's only", states)
	}
	stored := &corev1.ConfigMap{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(cm), stored); err != nil {
		t.Fatal(err)
	}
	if _, ok := stored.Data[maintenancestate.StorageKey("gone")]; ok {
		t.Error("the gone pod's state is still stored")
	}
	if stored.Data[maintenancestate.Key] != "{}" || stored.Data[maintenancestate.StorageKey("current")] == "" {
		t.Errorf("other keys changed: %v", stored.Data)
	}
}
