package serverargs

import (
	"flag"
	"time"
)

// SyncUsers is the command line of `guestbackup-server sync-users`, the
// server pod's container beside the Kopia server: it keeps the repository's
// users equal to the BSLS's users Secrets and its access rules
// guestbackup's, fronts guests' sessions with the session gate, serves the
// kopia client to guests, runs maintenance and verification, and publishes
// what it sees for the controller.
type SyncUsers struct {
	// Namespace is the namespace of the BSLS and its users Secrets.
	Namespace string
	// BSLS is the BSLS's name.
	BSLS string
	// BSLSUID is the BSLS's UID, which the Events user sync records name.
	BSLSUID string
	// ConfigFile is the repository connection init wrote.
	ConfigFile string
	// ServerURL is the Kopia server in this pod, on its loopback, e.g.
	// https://127.0.0.1:51517.
	ServerURL string
	// GateAddr is the address of the port guests' Kopia clients connect
	// to: the session gate in front of ServerURL, which ends the sessions
	// of users whose access user sync revokes.
	GateAddr string
	// CAFile is the CA the server's certificate verifies against.
	CAFile string
	// HealthAddr is the address of /healthz, /readyz (ready once users
	// are synced) and /metrics.
	HealthAddr string
	// AppendOnly lets guests create and read their own snapshots but not
	// delete them (Kopia ACLs), and applies retention on the server's
	// clock.
	AppendOnly bool
	// ActivityInterval is how often user sync publishes the guests' new
	// snapshots for the controller's audit; 0 disables it.
	ActivityInterval time.Duration
	// Maintenance runs the repository's maintenance as the owner init
	// connected, when it owns it.
	Maintenance bool
	// ClientAddr is the address of the client port, which serves the
	// kopia client to guests and takes their reports; empty: none.
	ClientAddr string
	// ClientBinaries are the kopia clients served on the client port, by
	// architecture (amd64, arm64): path in the pod.
	ClientBinaries map[string]string
	// ChainFile is the certificate chain the Kopia server presents (leaf
	// and CA), which the gate's port and the client port present too.
	ChainFile string
	// KeyFile is its key.
	KeyFile string
	// HtpasswdFile is the Kopia server's --htpasswd-file: user sync
	// writes into it a credential for each user the server enforces,
	// which the session gate hands the server for a password it verified
	// itself (usersync.Options.HtpasswdFile); empty: the server verifies
	// every password.
	HtpasswdFile string
	// MaintenanceLease, with Maintenance: run it only while this pod holds
	// this coordination.k8s.io Lease of Namespace, so that one of several
	// server pods runs it.
	MaintenanceLease string
	// VerifyInterval, with Maintenance, is how often to verify the
	// repository (every indexed content's pack is in the storage, whole;
	// a share of packs reads back), drop lost contents so that guests
	// upload them again, and publish it for the BSLS's RepositoryIntact
	// condition; 0 disables it.
	VerifyInterval time.Duration
	// VerifyReadBytes is how many pack bytes each verification pass reads
	// back from the storage and decrypts; passes take the packs in turn.
	// 0 reads none.
	VerifyReadBytes int64
	// QuotaInterval, while a user has a quota (the BSLS's spec.quota), is
	// how often to measure what each user stores, so that the session gate
	// refuses the writes of those that reached it; 0 disables quotas.
	QuotaInterval time.Duration
	// DefaultPolicy is the JSON of the BSLS's repository.defaultPolicy:
	// its retention is what an append-only server applies.
	DefaultPolicy string
	// RetentionInterval is how often an append-only server applies
	// retention.
	RetentionInterval time.Duration
	// StorageCheckInterval is how often to check that the repository's
	// storage answers (one metadata request) and publish it for the BSLS's
	// StorageAvailable condition; 0 disables it.
	StorageCheckInterval time.Duration
	// StatsInterval is how often to measure the repository's size for
	// /metrics, which lists every blob of the storage; 0 disables it.
	StatsInterval time.Duration
	// Resync is how often to compare the repository with the users
	// Secrets even when none changed.
	Resync time.Duration
	// ControlUsername is the Kopia server's control user, whose password
	// is in the environment.
	ControlUsername string
}

// NewSyncUsers is SyncUsers at the flags' defaults.
func NewSyncUsers() SyncUsers {
	var o SyncUsers
	o.AddFlags(flag.NewFlagSet(CommandSyncUsers, flag.ContinueOnError))
	return o
}

// AddFlags binds o's fields to sync-users' flags in fs and sets them to
// the flags' defaults.
func (o *SyncUsers) AddFlags(fs *flag.FlagSet) { o.declare(&flags{fs: fs}) }

// Args is o's command line, from the command on: the flags that are not
// at their defaults, and those the pod spec always states.
func (o SyncUsers) Args() []string { return args(CommandSyncUsers, o, (*SyncUsers).declare) }

// declare declares sync-users' flags, in the order Args writes them. The
// usage strings are the -help a person running the command reads.
func (o *SyncUsers) declare(f *flags) {
	// The pod's own namespace, $(POD_NAMESPACE): see param.expands.
	f.string(&o.Namespace, "namespace", "", "Namespace of the BSLS and its users Secrets.").expands = true
	f.string(&o.BSLS, "bsls", "", "Name of the BSLS.")
	f.string(&o.BSLSUID, "bsls-uid", "", "UID of the BSLS, which Events name.")
	f.string(&o.ConfigFile, "config-file", "", "The repository connection written by init.")
	f.string(&o.ServerURL, "server-url", "", "The Kopia server in this pod, on its loopback, e.g. https://127.0.0.1:51517.")
	f.string(&o.GateAddr, "gate-addr", "", "Address of the port guests' Kopia clients connect to: the session gate in front of --server-url, which ends the sessions of users whose access user sync revokes.")
	f.string(&o.CAFile, "tls-ca-file", "", "The CA the server's certificate verifies against.")
	f.string(&o.HealthAddr, "health-addr", ":8082", "Address of /healthz, /readyz (ready once users are synced) and /metrics.")
	f.bool(&o.AppendOnly, "append-only", "Let guests create and read their own snapshots, but not delete them (Kopia ACLs), and apply retention on the server's clock.").always = true
	f.duration(&o.ActivityInterval, "activity-interval", time.Minute, "How often to publish the guests' new snapshots for the controller's audit; 0 disables it.").always = true
	f.bool(&o.Maintenance, "maintenance", "Run the repository's maintenance as the owner init connected (when it owns it).").always = true
	f.string(&o.ClientAddr, "client-addr", "", "Address of the client port, which serves the kopia client to guests and takes their reports; empty: none.")
	f.pairs(&o.ClientBinaries, "client-binary", "arch", "path", "<arch>=<path> of a kopia client served on the client port (repeat per architecture).")
	f.string(&o.ChainFile, "tls-chain-file", "", "The certificate chain the Kopia server presents (leaf + CA), for the gate's port and the client port.")
	f.string(&o.KeyFile, "tls-key-file", "", "Its key.")
	f.string(&o.HtpasswdFile, "htpasswd-file", "", "The Kopia server's --htpasswd-file: user sync writes into it the credentials the session gate hands the server for passwords it verified itself; empty: the server verifies every password.")
	f.string(&o.MaintenanceLease, "maintenance-lease", "", "With --maintenance: run it only while this pod holds this coordination.k8s.io Lease of --namespace, so that one of several server pods runs it.")
	f.duration(&o.VerifyInterval, "verify-interval", DefaultVerifyInterval, "With --maintenance: how often to verify the repository (every indexed content's pack is in the storage, whole; a share of packs reads back), drop lost contents so that guests upload them again, and publish it for the BSLS's RepositoryIntact condition; 0 disables it.")
	f.int64(&o.VerifyReadBytes, "verify-read-bytes", DefaultVerifyReadBytes, "Pack bytes each verification pass reads back from the storage and decrypts; passes take the packs in turn. 0 reads none.")
	f.duration(&o.QuotaInterval, "quota-interval", DefaultQuotaInterval, "While a user has a quota (spec.quota of the BSLS): how often to measure what each user stores, so that the session gate refuses the writes of those that reached it; 0 disables quotas.")
	f.string(&o.DefaultPolicy, "default-policy", "", "JSON of the BSLS's repository.defaultPolicy: its retention is what an append-only server applies.")
	f.duration(&o.RetentionInterval, "retention-interval", time.Hour, "How often an append-only server applies retention.")
	f.duration(&o.StorageCheckInterval, "storage-check-interval", 10*time.Second, "How often to check that the repository's storage answers (one metadata request) and publish it for the BSLS's StorageAvailable condition; 0 disables it.")
	f.duration(&o.StatsInterval, "repository-stats-interval", 15*time.Minute, "How often to measure the repository's size for /metrics (lists every blob of the storage); 0 disables it.")
	f.duration(&o.Resync, "resync", 5*time.Minute, "How often to compare the repository with the Secrets even when none changed.")
	f.string(&o.ControlUsername, "server-control-username", "server-control", "The server's control user.")
}

// Defaults of sync-users' flags that the API documents as its own
// (spec.repository.maintenance, spec.quota). Package serverpod's tests
// hold the verification ones equal to package integrity's, which this
// package cannot link.
const (
	DefaultVerifyInterval  = 10 * time.Minute
	DefaultVerifyReadBytes = 256 << 20
	// DefaultQuotaInterval is how often a server pod measures what its
	// users store while one has a quota; spec.quota.measureInterval
	// overrides it.
	DefaultQuotaInterval = 5 * time.Minute
)
