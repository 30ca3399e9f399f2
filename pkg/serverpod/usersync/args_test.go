package usersync_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/pkg/serverargs"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/retention"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usersync"
)

// TestServeOptionsFrom: what user sync does for each command line.
func TestServeOptionsFrom(t *testing.T) {
	args := func(set func(*serverargs.SyncUsers)) serverargs.SyncUsers {
		a := serverargs.NewSyncUsers()
		a.Namespace, a.BSLS, a.BSLSUID, a.ConfigFile = "backup", "main", "uid", "/config/repository.config"
		a.ServerURL, a.GateAddr, a.CAFile = "https://127.0.0.1:51517", "0.0.0.0:51515", "/tls/ca.crt"
		a.ChainFile, a.KeyFile = "/config/tls-chain.pem", "/tls/tls.key"
		set(&a)
		return a
	}
	// want is what args(func(*SyncUsers) {}) gives in pod, changed by set.
	want := func(pod string, set func(*usersync.ServeOptions)) usersync.ServeOptions {
		o := usersync.ServeOptions{
			Options: usersync.Options{
				Namespace: "backup", BSLS: "main", BSLSUID: "uid", Pod: pod,
				RetentionInterval: time.Hour, ActivityInterval: time.Minute, StatsInterval: 15 * time.Minute,
				QuotaInterval: serverargs.DefaultQuotaInterval, Resync: 5 * time.Minute, StorageCheckInterval: 10 * time.Second,
				Retention: retention.FromSpec(nil),
			},
			ConfigFile: "/config/repository.config", ServerURL: "https://127.0.0.1:51517", ControlUsername: "server-control",
			CAFile: "/tls/ca.crt", HealthAddr: ":8082", GateAddr: "0.0.0.0:51515", ChainFile: "/config/tls-chain.pem", KeyFile: "/tls/tls.key",
		}
		o.Verify.Interval, o.Verify.ReadBytesPerPass = serverargs.DefaultVerifyInterval, serverargs.DefaultVerifyReadBytes
		set(&o)
		return o
	}
	policy := `{"retention":{"keepLatest":3}}`
	spec, err := serverpod.ParsePolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    serverargs.SyncUsers
		pod     string
		want    usersync.ServeOptions
		wantErr string
	}{
		{
			name: "the flags' defaults",
			args: args(func(*serverargs.SyncUsers) {}),
			want: want("", func(*usersync.ServeOptions) {}),
		},
		{
			name: "append-only with its retention, maintenance elected by a Lease, the client port",
			args: args(func(a *serverargs.SyncUsers) {
				a.AppendOnly, a.DefaultPolicy, a.Maintenance, a.MaintenanceLease = true, policy, true, "main-maintenance"
				a.ClientAddr, a.ClientBinaries = "0.0.0.0:51516", map[string]string{"amd64": "/usr/local/bin/kopia"}
				a.VerifyInterval, a.VerifyReadBytes, a.QuotaInterval = 0, 0, 0
			}),
			pod: "main-server-0",
			want: want("main-server-0", func(o *usersync.ServeOptions) {
				o.AppendOnly, o.Retention, o.Maintenance, o.MaintenanceLease = true, retention.FromSpec(spec), true, "main-maintenance"
				o.ClientPort = &usersync.ClientOptions{Addr: "0.0.0.0:51516", Binaries: map[string]string{"amd64": "/usr/local/bin/kopia"}}
				o.Verify.Interval, o.Verify.ReadBytesPerPass, o.QuotaInterval = 0, 0, 0
			}),
		},
		{
			name:    "a required flag missing",
			args:    args(func(a *serverargs.SyncUsers) { a.GateAddr = "" }),
			wantErr: "are required",
		},
		{
			name:    "a client port without a client",
			args:    args(func(a *serverargs.SyncUsers) { a.ClientAddr = "0.0.0.0:51516" }),
			wantErr: "--client-addr needs --client-binary",
		},
		{
			name:    "a storage check slower than its heartbeat",
			args:    args(func(a *serverargs.SyncUsers) { a.StorageCheckInterval = time.Hour }),
			wantErr: "--storage-check-interval 1h0m0s: at most",
		},
		{
			name:    "a maintenance Lease without the pod's name",
			args:    args(func(a *serverargs.SyncUsers) { a.MaintenanceLease = "main-maintenance" }),
			wantErr: "--maintenance-lease needs the pod's name in POD_NAME",
		},
		{
			name:    "a default policy that is not JSON",
			args:    args(func(a *serverargs.SyncUsers) { a.DefaultPolicy = "{" }),
			wantErr: "--default-policy",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := usersync.ServeOptionsFrom(tc.args, tc.pod)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(tc.want, got) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
