package serverargs

import (
	"flag"
	"time"
)

// Init is the command line of `guestbackup-server init`, the server pod's
// init container: it connects to the repository (creating it on first
// use), writes the TLS chain the Kopia server presents and the
// repository's access rules, and claims the repository's maintenance.
// Exactly one storage is set: FilesystemPath, S3Bucket, GCSBucket or
// AzureContainer.
type Init struct {
	// ConfigFile is where init writes the repository connection, which
	// the Kopia server and user sync then open.
	ConfigFile string
	// TLSCertFile is the server's certificate (tls.crt).
	TLSCertFile string
	// TLSCAFile is the CA that signed it (ca.crt).
	TLSCAFile string
	// ChainFile is where init writes the leaf and its CA, which the Kopia
	// server presents.
	ChainFile string
	// HtpasswdFile is where init creates the Kopia server's
	// --htpasswd-file, empty: user sync writes into it the credentials
	// the session gate hands the server for passwords it verified.
	HtpasswdFile string
	// AppendOnly writes the append-only access rules (guests create and
	// read their snapshots but cannot delete them) instead of the default
	// ones, before the server starts, so that it never serves under
	// Kopia's legacy rules.
	AppendOnly bool

	// FilesystemPath is the folder of a filesystem repository.
	FilesystemPath string

	// S3Bucket is the bucket of an S3 repository.
	S3Bucket string
	// S3Prefix is the prefix of the repository's objects in it.
	S3Prefix string
	// S3Endpoint is the S3 endpoint, host[:port].
	S3Endpoint string
	// S3Region is the bucket's region.
	S3Region string
	// S3DisableTLS talks plain HTTP to the S3 endpoint.
	S3DisableTLS bool
	// S3CAFile is a PEM bundle of the CAs the S3 endpoint's certificate
	// verifies against, for a private CA.
	S3CAFile string

	// GCSBucket is the bucket of a Google Cloud Storage repository.
	GCSBucket string
	// GCSPrefix is the prefix of the repository's objects in it.
	GCSPrefix string

	// AzureContainer is the container of an Azure Blob Storage repository.
	AzureContainer string
	// AzureStorageAccount is the storage account of the container.
	AzureStorageAccount string
	// AzurePrefix is the prefix of the repository's blobs in it.
	AzurePrefix string
	// AzureStorageDomain is the domain of the storage account's blob
	// endpoint, <account>.<domain>; empty: blob.core.windows.net.
	AzureStorageDomain string
	// AzureDisableTLS talks plain HTTP to the blob endpoint.
	AzureDisableTLS bool

	// WorkloadIdentity gives the storage no static keys: init reaches it
	// as the pod's cloud identity (IRSA, GKE or Azure Workload Identity).
	WorkloadIdentity bool
	// CredentialsSecret is <namespace>/<name> of a Velero credential
	// Secret init reads the storage's credentials from, through the API,
	// instead of from the environment: a Secret in another namespace
	// cannot be mounted.
	CredentialsSecret string
	// CredentialsKey is the key of that Secret holding the provider's
	// credentials file.
	CredentialsKey string
	// CredentialsProfile is the profile of an AWS credentials file to use.
	CredentialsProfile string
	// AzureStorageKeyVariable is the key of an Azure credentials file
	// holding the storage account's key; empty: the file holds a service
	// principal's.
	AzureStorageKeyVariable string

	// DefaultPolicy is the JSON of the BSLS's repository.defaultPolicy,
	// which init sets when it creates the repository.
	DefaultPolicy string

	// Namespace is the BSLS's namespace and BSLS its name: the
	// repository's maintenance owner is
	// guestbackup-maintenance@<bsls>.<namespace>.
	Namespace, BSLS string
	// Maintenance claims the repository's maintenance for the BSLS's owner
	// identity (unless someone else owns it) and sets its schedule; user
	// sync then runs the cycles.
	Maintenance bool
	// MaintenanceQuickInterval is how often quick maintenance runs;
	// the default is Kopia's own.
	MaintenanceQuickInterval time.Duration
	// MaintenanceFullInterval is how often full maintenance runs; the
	// default is Kopia's own.
	MaintenanceFullInterval time.Duration
}

// NewInit is Init at the flags' defaults.
func NewInit() Init {
	var o Init
	o.AddFlags(flag.NewFlagSet(CommandInit, flag.ContinueOnError))
	return o
}

// AddFlags binds o's fields to init's flags in fs and sets them to the
// flags' defaults.
func (o *Init) AddFlags(fs *flag.FlagSet) { o.declare(&flags{fs: fs}) }

// Args is o's command line, from the command on: the flags that are not
// at their defaults, and those the pod spec always states.
func (o Init) Args() []string { return args(CommandInit, o, (*Init).declare) }

// declare declares init's flags, in the order Args writes them. The usage
// strings are the -help a person running the command reads.
func (o *Init) declare(f *flags) {
	f.string(&o.ConfigFile, "config-file", "", "Where to write the repository connection.")
	f.string(&o.TLSCertFile, "tls-cert-file", "", "The server's certificate (tls.crt).")
	f.string(&o.TLSCAFile, "tls-ca-file", "", "The CA that signed it (ca.crt).")
	f.string(&o.ChainFile, "tls-chain-file", "", "Where to write leaf + CA for the server.")
	f.string(&o.HtpasswdFile, "htpasswd-file", "", "Where to create the Kopia server's --htpasswd-file, empty: user sync writes the session gate's credentials into it.")
	f.bool(&o.AppendOnly, "append-only", "Write the append-only access rules instead of the default ones.").always = true
	f.string(&o.FilesystemPath, "filesystem-path", "", "Folder of a filesystem repository.")
	f.string(&o.S3Bucket, "s3-bucket", "", "Bucket of an S3 repository.")
	f.string(&o.S3Prefix, "s3-prefix", "", "Prefix of the repository's objects.")
	f.string(&o.S3Endpoint, "s3-endpoint", "", "S3 endpoint (host[:port]).")
	f.string(&o.S3Region, "s3-region", "", "S3 region.")
	f.bool(&o.S3DisableTLS, "s3-disable-tls", "Talk plain HTTP to the S3 endpoint.")
	f.string(&o.S3CAFile, "s3-ca-file", "", "PEM bundle of CAs for the S3 endpoint.")
	f.string(&o.GCSBucket, "gcs-bucket", "", "Bucket of a Google Cloud Storage repository.")
	f.string(&o.GCSPrefix, "gcs-prefix", "", "Prefix of the repository's objects in it.")
	f.string(&o.AzureContainer, "azure-container", "", "Container of an Azure Blob Storage repository.")
	f.string(&o.AzureStorageAccount, "azure-storage-account", "", "Storage account of the container.")
	f.string(&o.AzurePrefix, "azure-prefix", "", "Prefix of the repository's blobs in it.")
	f.string(&o.AzureStorageDomain, "azure-storage-domain", "", "Domain of the storage account's blob endpoint, <account>.<domain> (default blob.core.windows.net).")
	f.bool(&o.AzureDisableTLS, "azure-disable-tls", "Talk plain HTTP to the blob endpoint.")
	f.bool(&o.WorkloadIdentity, "workload-identity", "Use no static keys: reach the storage as the pod's cloud identity.")
	f.string(&o.CredentialsSecret, "credentials-secret", "", "<namespace>/<name> of a Velero credential Secret to read the storage credentials from, through the API, instead of the environment.")
	f.string(&o.CredentialsKey, "credentials-key", "cloud", "Key of that Secret holding the provider's credentials file.").with = &o.CredentialsSecret
	f.string(&o.CredentialsProfile, "credentials-profile", "default", "Profile of an AWS credentials file to use.")
	f.string(&o.AzureStorageKeyVariable, "azure-storage-key-variable", "", "Key of an Azure credentials file holding the storage account key; empty: a service principal.")
	f.string(&o.DefaultPolicy, "default-policy", "", "JSON of the BSLS's repository.defaultPolicy, applied when the repository is created.")
	f.string(&o.Namespace, "namespace", "", "Namespace of the BSLS: the maintenance owner is guestbackup-maintenance@<bsls>.<namespace>.")
	f.string(&o.BSLS, "bsls", "", "Name of the BSLS.")
	f.bool(&o.Maintenance, "maintenance", "Claim the repository's maintenance for the BSLS's owner identity (unless someone else owns it) and set its schedule.").always = true
	f.duration(&o.MaintenanceQuickInterval, "maintenance-quick-interval", KopiaQuickMaintenanceInterval, "How often quick maintenance runs.")
	f.duration(&o.MaintenanceFullInterval, "maintenance-full-interval", KopiaFullMaintenanceInterval, "How often full maintenance runs.")
}

// Kopia's own maintenance schedule, the default of init's flags: quick
// hourly, full daily. Package serverpod's tests hold them equal to
// Kopia's, which this package cannot link.
const (
	KopiaQuickMaintenanceInterval = time.Hour
	KopiaFullMaintenanceInterval  = 24 * time.Hour
)
