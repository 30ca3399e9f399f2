package kopiaserver

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// TestDeploymentNeverRunsTwoGenerations: an old server pod beside a new one
// would keep writing the old access rules (default-mode ACLs after a switch
// to append-only), so every storage kind replaces its pods, never rolls.
func TestDeploymentNeverRunsTwoGenerations(t *testing.T) {
	s3 := &v1alpha1.S3Storage{Bucket: "backups", Endpoint: "s3.example.com"}
	for name, storage := range map[string]v1alpha1.StorageSpec{
		"filesystem": {Filesystem: &v1alpha1.FilesystemStorage{}},
		"s3":         {S3: s3},
	} {
		for _, appendOnly := range []bool{false, true} {
			b := &v1alpha1.BackupStorageLocationServer{
				ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"},
				Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: storage, Access: v1alpha1.AccessSpec{AppendOnly: appendOnly}},
			}
			d, err := Deployment(b, WorkloadInputs{Image: "guestbackup:test", TLSChecksum: "test", S3: storage.S3, S3CredentialsSecret: "s3-keys"})
			if err != nil {
				t.Fatalf("%s, appendOnly=%v: %v", name, appendOnly, err)
			}
			if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate != nil {
				t.Errorf("%s, appendOnly=%v: strategy %+v, want Recreate", name, appendOnly, d.Spec.Strategy)
			}
		}
	}
}
