// Command guestbackup-server runs beside the Kopia server in a
// BackupStorageLocationServer's pod:
//
//	guestbackup-server init        connect to or create the repository, write its access
//	                               rules (ACLs), write the TLS chain
//	guestbackup-server sync-users  keep the repository's users equal to the users Secrets and
//	                               its ACLs guestbackup's; on an append-only server, apply
//	                               retention on the server's clock; run maintenance; serve
//	                               the kopia client to guests and take their reports
//
// Passwords and storage credentials come from the environment (KOPIA_PASSWORD,
// KOPIA_SERVER_CONTROL_PASSWORD, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN), from a Velero credential Secret read through the API,
// or from the pod's cloud identity, never from flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/guestbackup/guestbackup/pkg/kopiaenv"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/integrity"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
	"github.com/guestbackup/guestbackup/pkg/serverpod/retention"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usersync"
)

func main() {
	const usage = "usage: guestbackup-server init|sync-users [flags]  (-help after a command lists its flags)"
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "-h", "-help", "--help", "help":
		fmt.Println(usage)
		return
	case "init":
		err = runInit(os.Args[2:])
	case "sync-users":
		err = runSyncUsers(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want init or sync-users", os.Args[1])
	}
	if errors.Is(err, flag.ErrHelp) {
		return // the flag set printed its usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "guestbackup-server:", err)
		os.Exit(1)
	}
}

// env returns a required environment variable.
func env(name string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("environment variable %s is not set", name)
	}
	return v, nil
}

// kubeClient is a client of the API server the pod runs in.
func kubeClient() (kubernetes.Interface, error) {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}

func runInit(args []string) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	var (
		o             = serverpod.InitOptions{Out: os.Stdout}
		fsPath        string
		s3            serverpod.S3Location
		s3CAFile      string
		gcs           serverpod.GCSLocation
		azure         serverpod.AzureLocation
		defaultPolicy string
		veleroSecret  string
		velero        serverpod.VeleroCredentials
	)
	fs.StringVar(&o.ConfigFile, "config-file", "", "Where to write the repository connection.")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", "", "The server's certificate (tls.crt).")
	fs.StringVar(&o.TLSCAFile, "tls-ca-file", "", "The CA that signed it (ca.crt).")
	fs.StringVar(&o.ChainFile, "tls-chain-file", "", "Where to write leaf + CA for the server.")
	fs.StringVar(&fsPath, "filesystem-path", "", "Folder of a filesystem repository.")
	fs.StringVar(&s3.Bucket, "s3-bucket", "", "Bucket of an S3 repository.")
	fs.StringVar(&s3.Endpoint, "s3-endpoint", "", "S3 endpoint (host[:port]).")
	fs.StringVar(&s3.Region, "s3-region", "", "S3 region.")
	fs.StringVar(&s3.Prefix, "s3-prefix", "", "Prefix of the repository's objects.")
	fs.BoolVar(&s3.DisableTLS, "s3-disable-tls", false, "Talk plain HTTP to the S3 endpoint.")
	fs.StringVar(&s3CAFile, "s3-ca-file", "", "PEM bundle of CAs for the S3 endpoint.")
	fs.StringVar(&gcs.Bucket, "gcs-bucket", "", "Bucket of a Google Cloud Storage repository.")
	fs.StringVar(&gcs.Prefix, "gcs-prefix", "", "Prefix of the repository's objects in it.")
	fs.StringVar(&azure.Container, "azure-container", "", "Container of an Azure Blob Storage repository.")
	fs.StringVar(&azure.Prefix, "azure-prefix", "", "Prefix of the repository's blobs in it.")
	fs.StringVar(&azure.StorageAccount, "azure-storage-account", "", "Storage account of the container.")
	fs.StringVar(&azure.StorageDomain, "azure-storage-domain", "", "Domain of the storage account's blob endpoint, <account>.<domain> (default blob.core.windows.net).")
	fs.BoolVar(&azure.DisableTLS, "azure-disable-tls", false, "Talk plain HTTP to the blob endpoint.")
	fs.StringVar(&veleroSecret, "credentials-secret", "", "<namespace>/<name> of a Velero credential Secret to read the storage credentials from, through the API, instead of the environment.")
	fs.StringVar(&velero.Key, "credentials-key", "cloud", "Key of that Secret holding the provider's credentials file.")
	fs.StringVar(&velero.Profile, "credentials-profile", "default", "Profile of an AWS credentials file to use.")
	fs.StringVar(&velero.AzureStorageKeyVariable, "azure-storage-key-variable", "", "Key of an Azure credentials file holding the storage account key; empty: a service principal.")
	fs.BoolVar(&o.WorkloadIdentity, "workload-identity", false, "Use no static keys: reach the storage as the pod's cloud identity.")
	fs.StringVar(&defaultPolicy, "default-policy", "", "JSON of the BSLS's repository.defaultPolicy, applied when the repository is created.")
	fs.BoolVar(&o.AppendOnly, "append-only", false, "Write the append-only access rules instead of the default ones.")
	var (
		m           serverpod.MaintenanceOptions
		maintain    bool
		quick, full time.Duration
	)
	defaults := maintenance.DefaultSchedule()
	fs.StringVar(&m.Namespace, "namespace", "", "Namespace of the BSLS: the maintenance owner is guestbackup-maintenance@<bsls>.<namespace>.")
	fs.StringVar(&m.BSLS, "bsls", "", "Name of the BSLS.")
	fs.BoolVar(&maintain, "maintenance", false, "Claim the repository's maintenance for the BSLS's owner identity (unless someone else owns it) and set its schedule.")
	fs.DurationVar(&quick, "maintenance-quick-interval", defaults.Quick, "How often quick maintenance runs.")
	fs.DurationVar(&full, "maintenance-full-interval", defaults.Full, "How often full maintenance runs.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if maintain {
		if m.Namespace == "" || m.BSLS == "" {
			return errors.New("--maintenance needs --namespace and --bsls")
		}
		m.Schedule = maintenance.Schedule{Quick: quick, Full: full}
		o.Maintenance = &m
	}
	var err error
	if o.Password, err = env(kopiaenv.RepositoryPassword); err != nil {
		return err
	}
	if o.Defaults, err = serverpod.ParsePolicy(defaultPolicy); err != nil {
		return fmt.Errorf("--default-policy: %w", err)
	}
	switch kinds := countSet(fsPath, s3.Bucket, gcs.Bucket, azure.Container); {
	case kinds != 1:
		return errors.New("set exactly one of --filesystem-path, --s3-bucket, --gcs-bucket and --azure-container")
	case fsPath != "":
		o.Storage.Filesystem = &serverpod.FilesystemLocation{Path: fsPath}
	case s3.Bucket != "":
		if s3CAFile != "" {
			if s3.CABundle, err = os.ReadFile(s3CAFile); err != nil {
				return fmt.Errorf("read S3 CA bundle: %w", err)
			}
		}
		o.Storage.S3 = &s3
	case gcs.Bucket != "":
		o.Storage.GCS = &gcs
	default:
		o.Storage.Azure = &azure
	}
	if veleroSecret != "" {
		var ok bool
		if velero.Namespace, velero.Name, ok = strings.Cut(veleroSecret, "/"); !ok || velero.Namespace == "" || velero.Name == "" {
			return fmt.Errorf("--credentials-secret %q: want <namespace>/<name>", veleroSecret)
		}
		if velero.Client, err = kubeClient(); err != nil {
			return err
		}
		o.Velero = &velero
	}
	return serverpod.Init(context.Background(), o)
}

// countSet counts the values that are not empty.
func countSet(values ...string) int {
	n := 0
	for _, v := range values {
		if v != "" {
			n++
		}
	}
	return n
}

func runSyncUsers(args []string) error {
	fs := flag.NewFlagSet("sync-users", flag.ContinueOnError)
	var (
		o          usersync.ServeOptions
		bslsUID    string
		policyJSON string
		logOpts    zap.Options
	)
	fs.StringVar(&o.Namespace, "namespace", "", "Namespace of the BSLS and its users Secrets.")
	fs.StringVar(&o.BSLS, "bsls", "", "Name of the BSLS.")
	fs.StringVar(&bslsUID, "bsls-uid", "", "UID of the BSLS, which Events name.")
	fs.BoolVar(&o.AppendOnly, "append-only", false, "Let guests create and read their own snapshots, but not delete them (Kopia ACLs), and apply retention on the server's clock.")
	fs.StringVar(&policyJSON, "default-policy", "", "JSON of the BSLS's repository.defaultPolicy: its retention is what an append-only server applies.")
	fs.DurationVar(&o.RetentionInterval, "retention-interval", time.Hour, "How often an append-only server applies retention.")
	fs.DurationVar(&o.ActivityInterval, "activity-interval", time.Minute, "How often to publish the guests' new snapshots for the controller's audit; 0 disables it.")
	fs.DurationVar(&o.QuotaInterval, "quota-interval", usersync.DefaultQuotaInterval, "While a user has a quota (spec.quota of the BSLS): how often to measure what each user stores, so that the session gate refuses the writes of those that reached it; 0 disables quotas.")
	fs.DurationVar(&o.StorageCheckInterval, "storage-check-interval", 10*time.Second, "How often to check that the repository's storage answers (one metadata request) and publish it for the BSLS's StorageAvailable condition; 0 disables it.")
	fs.DurationVar(&o.StatsInterval, "repository-stats-interval", 15*time.Minute, "How often to measure the repository's size for /metrics (lists every blob of the storage); 0 disables it.")
	fs.DurationVar(&o.Resync, "resync", 5*time.Minute, "How often to compare the repository with the Secrets even when none changed.")
	fs.StringVar(&o.ConfigFile, "config-file", "", "The repository connection written by init.")
	fs.StringVar(&o.ServerURL, "server-url", "", "The Kopia server in this pod, on its loopback, e.g. https://127.0.0.1:51517.")
	fs.StringVar(&o.GateAddr, "gate-addr", "", "Address of the port guests' Kopia clients connect to: the session gate in front of --server-url, which ends the sessions of users whose access user sync revokes.")
	fs.StringVar(&o.ControlUsername, "server-control-username", "server-control", "The server's control user.")
	fs.StringVar(&o.CAFile, "tls-ca-file", "", "The CA the server's certificate verifies against.")
	fs.StringVar(&o.HealthAddr, "health-addr", ":8082", "Address of /healthz, /readyz (ready once users are synced) and /metrics.")
	fs.BoolVar(&o.Maintenance, "maintenance", false, "Run the repository's maintenance as the owner init connected (when it owns it).")
	fs.DurationVar(&o.Verify.Interval, "verify-interval", integrity.DefaultInterval, "With --maintenance: how often to verify the repository (every indexed content's pack is in the storage, whole; a share of packs reads back), drop lost contents so that guests upload them again, and publish it for the BSLS's RepositoryIntact condition; 0 disables it.")
	fs.Int64Var(&o.Verify.ReadBytesPerPass, "verify-read-bytes", integrity.DefaultReadBytesPerPass, "Pack bytes each verification pass reads back from the storage and decrypts; passes take the packs in turn. 0 reads none.")
	fs.StringVar(&o.MaintenanceLease, "maintenance-lease", "", "With --maintenance: run it only while this pod holds this coordination.k8s.io Lease of --namespace, so that one of several server pods runs it.")
	var client usersync.ClientOptions
	clients := map[string]string{}
	fs.StringVar(&client.Addr, "client-addr", "", "Address of the client port, which serves the kopia client to guests and takes their reports; empty: none.")
	fs.Func("client-binary", "<arch>=<path> of a kopia client served on the client port (repeat per architecture).", func(v string) error {
		arch, p, ok := strings.Cut(v, "=")
		if !ok || arch == "" || p == "" {
			return fmt.Errorf("%q: want <arch>=<path>", v)
		}
		clients[arch] = p
		return nil
	})
	fs.StringVar(&o.ChainFile, "tls-chain-file", "", "The certificate chain the Kopia server presents (leaf + CA), for the gate's port and the client port.")
	fs.StringVar(&o.KeyFile, "tls-key-file", "", "Its key.")
	logOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Namespace == "" || o.BSLS == "" || o.ConfigFile == "" || o.ServerURL == "" || o.CAFile == "" || o.GateAddr == "" || o.ChainFile == "" || o.KeyFile == "" {
		return errors.New("--namespace, --bsls, --config-file, --server-url, --tls-ca-file, --gate-addr, --tls-chain-file and --tls-key-file are required")
	}
	if client.Addr != "" {
		if len(clients) == 0 {
			return errors.New("--client-addr needs --client-binary")
		}
		client.Binaries = clients
		o.ClientPort = &client
	}
	o.Log = zap.New(zap.UseFlagOptions(&logOpts))
	if o.StorageCheckInterval > maintenancestate.StorageHeartbeat {
		// Its state would grow stale between checks.
		return fmt.Errorf("--storage-check-interval %s: at most %s", o.StorageCheckInterval, maintenancestate.StorageHeartbeat)
	}
	// The pod's name (downward API): its identity in the Lease, and the
	// key of its storage state.
	o.Pod = os.Getenv("POD_NAME")
	if o.MaintenanceLease != "" && o.Pod == "" {
		return errors.New("--maintenance-lease needs the pod's name in POD_NAME")
	}
	o.BSLSUID = types.UID(bslsUID)
	spec, err := serverpod.ParsePolicy(policyJSON)
	if err != nil {
		return fmt.Errorf("--default-policy: %w", err)
	}
	o.Retention = retention.FromSpec(spec)
	if o.Password, err = env(kopiaenv.RepositoryPassword); err != nil {
		return err
	}
	if o.ControlPassword, err = env(kopiaenv.ControlPassword); err != nil {
		return err
	}
	if o.Client, err = kubeClient(); err != nil {
		return err
	}
	return usersync.Serve(ctrl.SetupSignalHandler(), o)
}
