package kopiaserver

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/serverargs"
)

// TestServerCommandLines: what the BSLS's maintenance, quota and velero
// settings make of the server pod's command lines, beyond the golden
// cases. A setting at the server's own default is left to it: the pod
// does the same with or without the flag.
func TestServerCommandLines(t *testing.T) {
	minutes := func(m int) *metav1.Duration { return &metav1.Duration{Duration: time.Duration(m) * time.Minute} }
	for _, tc := range []struct {
		name string
		spec func(*v1alpha1.BackupStorageLocationServerSpec)
		in   WorkloadInputs
		// init and sync are what the case changes from the defaults the
		// controller writes for a filesystem BSLS.
		init func(*serverargs.Init)
		sync func(*serverargs.SyncUsers)
	}{
		{name: "defaults"},
		{
			name: "maintenance disabled",
			spec: func(s *v1alpha1.BackupStorageLocationServerSpec) {
				s.Repository.Maintenance = &v1alpha1.MaintenanceSpec{Disabled: true}
			},
			init: func(a *serverargs.Init) { a.Maintenance = false },
			sync: func(a *serverargs.SyncUsers) { a.Maintenance = false },
		},
		{
			name: "every interval of maintenance, verification and quotas set",
			spec: func(s *v1alpha1.BackupStorageLocationServerSpec) {
				s.Repository.Maintenance = &v1alpha1.MaintenanceSpec{QuickInterval: minutes(30), FullInterval: minutes(600),
					VerifyInterval: minutes(60), VerifyReadBytes: ptr.To(resource.MustParse("1Gi"))}
				s.Quota = &v1alpha1.QuotaSpec{MeasureInterval: minutes(1)}
			},
			init: func(a *serverargs.Init) {
				a.MaintenanceQuickInterval, a.MaintenanceFullInterval = 30*time.Minute, 10*time.Hour
			},
			sync: func(a *serverargs.SyncUsers) {
				a.VerifyInterval, a.VerifyReadBytes, a.QuotaInterval = time.Hour, 1<<30, time.Minute
			},
		},
		{
			name: "verification and quotas off",
			spec: func(s *v1alpha1.BackupStorageLocationServerSpec) {
				s.Repository.Maintenance = &v1alpha1.MaintenanceSpec{VerifyInterval: minutes(0), VerifyReadBytes: ptr.To(resource.MustParse("0"))}
				s.Quota = &v1alpha1.QuotaSpec{MeasureInterval: minutes(0)}
			},
			sync: func(a *serverargs.SyncUsers) { a.VerifyInterval, a.VerifyReadBytes, a.QuotaInterval = 0, 0, 0 },
		},
		{
			name: "S3 through a Velero Secret at the default profile",
			spec: func(s *v1alpha1.BackupStorageLocationServerSpec) {
				s.Storage = v1alpha1.StorageSpec{BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Name: "default", Namespace: "velero"}}
			},
			in: WorkloadInputs{S3: &v1alpha1.S3Storage{Bucket: "velero"},
				VeleroCredentials: &VeleroCredentials{Namespace: "velero", Secret: "cloud-credentials", Key: "cloud", Profile: "default"}},
			init: func(a *serverargs.Init) {
				a.FilesystemPath, a.S3Bucket, a.CredentialsSecret = "", "velero", "velero/cloud-credentials"
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &v1alpha1.BackupStorageLocationServer{
				ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup", UID: "uid"},
				Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
			}
			if tc.spec != nil {
				tc.spec(&b.Spec)
			}
			tc.in.ActivityInterval = time.Minute
			wantInit, wantSync := defaultServerArgs(), defaultSyncArgs()
			if tc.init != nil {
				tc.init(&wantInit)
			}
			if tc.sync != nil {
				tc.sync(&wantSync)
			}
			if diff := cmp.Diff(wantInit, initArgs(b, tc.in, "")); diff != "" {
				t.Errorf("init (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantSync, syncUsersArgs(b, tc.in, "")); diff != "" {
				t.Errorf("sync-users (-want +got):\n%s", diff)
			}
		})
	}
}

// defaultServerArgs is init's command line for the BSLS backup/main on a
// filesystem, at every default.
func defaultServerArgs() serverargs.Init {
	a := serverargs.NewInit()
	a.ConfigFile, a.TLSCertFile, a.TLSCAFile, a.ChainFile = "/config/repository.config", "/tls/tls.crt", "/tls/ca.crt", "/config/tls-chain.pem"
	a.HtpasswdFile = "/config/gate.htpasswd"
	a.FilesystemPath, a.Namespace, a.BSLS, a.Maintenance = "/repository", "backup", "main", true
	return a
}

// defaultSyncArgs is sync-users' for the same BSLS.
func defaultSyncArgs() serverargs.SyncUsers {
	a := serverargs.NewSyncUsers()
	a.Namespace, a.BSLS, a.BSLSUID = "$(POD_NAMESPACE)", "main", "uid"
	a.ConfigFile, a.ServerURL, a.GateAddr = "/config/repository.config", "https://127.0.0.1:51517", "0.0.0.0:51515"
	a.CAFile, a.HealthAddr, a.Maintenance = "/tls/ca.crt", "0.0.0.0:8082", true
	a.ClientAddr = "0.0.0.0:51516"
	a.ClientBinaries = map[string]string{"amd64": "/usr/local/bin/kopia", "arm64": "/usr/local/share/guestbackup/kopia-linux-arm64"}
	a.ChainFile, a.KeyFile = "/config/tls-chain.pem", "/tls/tls.key"
	a.HtpasswdFile = "/config/gate.htpasswd"
	return a
}
