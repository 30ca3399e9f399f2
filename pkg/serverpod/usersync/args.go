package usersync

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverargs"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/retention"
)

// ServeOptionsFrom is what sync-users' command line a asks Serve to do, in
// the pod named pod (the downward API's POD_NAME: its identity in the
// maintenance Lease and the key of its storage state). The passwords, the
// API client and the log are the caller's to add: they are not arguments.
func ServeOptionsFrom(a serverargs.SyncUsers, pod string) (ServeOptions, error) {
	if a.Namespace == "" || a.BSLS == "" || a.ConfigFile == "" || a.ServerURL == "" || a.CAFile == "" || a.GateAddr == "" || a.ChainFile == "" || a.KeyFile == "" {
		return ServeOptions{}, errors.New("--namespace, --bsls, --config-file, --server-url, --tls-ca-file, --gate-addr, --tls-chain-file and --tls-key-file are required")
	}
	o := ServeOptions{
		Options: Options{
			Namespace: a.Namespace, BSLS: a.BSLS, BSLSUID: types.UID(a.BSLSUID), Pod: pod,
			AppendOnly: a.AppendOnly, RetentionInterval: a.RetentionInterval,
			ActivityInterval: a.ActivityInterval, StatsInterval: a.StatsInterval, QuotaInterval: a.QuotaInterval,
			Resync: a.Resync, StorageCheckInterval: a.StorageCheckInterval, HtpasswdFile: a.HtpasswdFile,
		},
		ConfigFile: a.ConfigFile, ServerURL: a.ServerURL, ControlUsername: a.ControlUsername, CAFile: a.CAFile,
		HealthAddr: a.HealthAddr, GateAddr: a.GateAddr, ChainFile: a.ChainFile, KeyFile: a.KeyFile,
		Maintenance: a.Maintenance, MaintenanceLease: a.MaintenanceLease,
	}
	o.Verify.Interval, o.Verify.ReadBytesPerPass = a.VerifyInterval, a.VerifyReadBytes
	if a.ClientAddr != "" {
		if len(a.ClientBinaries) == 0 {
			return ServeOptions{}, errors.New("--client-addr needs --client-binary")
		}
		o.ClientPort = &ClientOptions{Addr: a.ClientAddr, Binaries: a.ClientBinaries}
	}
	if o.StorageCheckInterval > maintenancestate.StorageHeartbeat {
		// Its state would grow stale between checks.
		return ServeOptions{}, fmt.Errorf("--storage-check-interval %s: at most %s", o.StorageCheckInterval, maintenancestate.StorageHeartbeat)
	}
	if o.MaintenanceLease != "" && o.Pod == "" {
		return ServeOptions{}, errors.New("--maintenance-lease needs the pod's name in POD_NAME")
	}
	spec, err := serverpod.ParsePolicy(a.DefaultPolicy)
	if err != nil {
		return ServeOptions{}, fmt.Errorf("--default-policy: %w", err)
	}
	o.Retention = retention.FromSpec(spec)
	return o, nil
}
