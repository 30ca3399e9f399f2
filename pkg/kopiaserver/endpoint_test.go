package kopiaserver

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

func TestEndpoint(t *testing.T) {
	tests := []struct {
		name string
		spec v1alpha1.BackupStorageLocationServerSpec
		want string
	}{
		{name: "defaults", want: "https://main.backup.svc:51515"},
		{name: "service port", spec: v1alpha1.BackupStorageLocationServerSpec{Service: v1alpha1.ServiceSpec{Port: 443}}, want: "https://main.backup.svc:443"},
		{
			name: "client URL wins",
			spec: v1alpha1.BackupStorageLocationServerSpec{ClientURL: "https://10.0.2.2:40000", Service: v1alpha1.ServiceSpec{Port: 443}},
			want: "https://10.0.2.2:40000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bsls := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}, Spec: tt.spec}
			if got := Endpoint(bsls); got != tt.want {
				t.Fatalf("Endpoint = %s, want %s", got, tt.want)
			}
		})
	}
}
