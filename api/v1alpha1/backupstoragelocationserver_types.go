package v1alpha1

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultServerPort is the port the Kopia repository server listens on.
const DefaultServerPort = 51515

// BackupStorageLocationServerSpec is what a cluster admin asks for: where the
// repository lives, how the server is reached and secured, and who may use it.
type BackupStorageLocationServerSpec struct {
	// Storage is where the Kopia repository lives. Exactly one kind is set.
	Storage StorageSpec `json:"storage"`

	// Repository configures the Kopia repository kept in Storage.
	// +optional
	Repository RepositorySpec `json:"repository,omitempty"`

	// TLS configures the server's certificate. Guests trust the CA and
	// check that the certificate names the endpoint's host, so leaf
	// renewals never touch a guest. When empty, this BSLS gets a CA of its own,
	// kept in Secret <bsls>-ca, so that no other party's certificate is
	// trusted by its guests: issued by cert-manager (a selfSigned Issuer, a
	// CA Certificate and a CA Issuer in the BSLS's namespace) when the
	// controller runs with --cert-manager-ca, else by the controller itself.
	// +optional
	TLS TLSSpec `json:"tls,omitempty"`

	// Access decides which VirtualMachines may use this server and what
	// their guests may do with their snapshots.
	// +optional
	Access AccessSpec `json:"access,omitempty"`

	// Service configures the Service in front of the server.
	// +optional
	Service ServiceSpec `json:"service,omitempty"`

	// PodConfig configures where and with which resources the server runs.
	// +optional
	PodConfig PodConfig `json:"podConfig,omitempty"`

	// Replicas is the number of server pods. Zero stops the server without
	// touching the repository. Each pod verifies one login at a time, so
	// logins per second grow with replicas; above 1 the storage must be
	// shared: S3, or a ReadWriteMany filesystem claim.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// GuestSpread bounds the random delay each guest waits before its first
	// connection at boot and before each scheduled snapshot (systemd's
	// RandomizedDelaySec), so that VMs started together, after a cluster
	// restart for instance, do not all log in at once: the Kopia server
	// verifies one login at a time (see passwordHash). A change reaches a
	// guest at its next boot. Unset: 15m before each scheduled snapshot and
	// no delay before the first connection; 0s: no delay; at most 24h.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="guestSpread is between 0s and 24h"
	// +optional
	GuestSpread *metav1.Duration `json:"guestSpread,omitempty"`

	// RequestPollInterval is how often, at most, a running guest asks its
	// server for the requests (GuestSnapshot, GuestRestore) addressed to
	// it, when the requests' API is installed (alpha, the chart's
	// requests.enabled). The server holds a poll that finds nothing for up
	// to 4 minutes, and answers it as soon as a request is addressed to the
	// guest: a request starts within seconds, and the guest asks again at
	// once. This interval spaces only the polls answered sooner (a server
	// that holds none, an error). Each poll is one HTTPS request that costs
	// the server pod no password hash. A change reaches a guest when its
	// bootstrap is next rendered (at its next boot at the latest). Unset:
	// 30s; between 10s and 10m.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s') && duration(self) <= duration('10m')",message="requestPollInterval is between 10s and 10m"
	// +optional
	RequestPollInterval *metav1.Duration `json:"requestPollInterval,omitempty"`

	// ClientURL is the URL guests are told to connect to, for guests that
	// cannot reach the Service's cluster DNS name: VMs on bridged or
	// secondary networks, or a LoadBalancer or ingress in front of the
	// server. Default: https://<service>.<namespace>.svc:51515. Guests from
	// outside the pod network pass the server's NetworkPolicy only from
	// access.clientIPBlocks.
	// +kubebuilder:validation:Pattern=`^https://[^\s/?#]+(/[^\s?#]*)?$`
	// +kubebuilder:validation:MaxLength=2048
	// +optional
	ClientURL string `json:"clientURL,omitempty"`

	// Quota bounds what each VM may store in the repository, so that one
	// careless or compromised guest cannot fill the storage for every other.
	// A VM over its quota has its guest's writes refused (its snapshots
	// fail, saying so) until it stores less or its quota is raised; it may
	// still list, restore and delete its snapshots. Unset: no bound.
	// +optional
	Quota *QuotaSpec `json:"quota,omitempty"`
}

// QuotaSpec is what each VM may store in the repository: a default for
// every VM and overrides for chosen ones. What a VM stores is the size in
// the storage (compressed and encrypted) of the data its snapshots
// reference, each piece counted once for the VM however many of its
// snapshots share it, and counted for every VM that references it
// (docs/operations.md, "Per-VM quota").
type QuotaSpec struct {
	// PerVM is what each VM may store unless an override names it. Unset:
	// no bound but the overrides'. 0 refuses every write.
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : !self.startsWith('-')",message="a quota is not negative"
	// +optional
	PerVM *resource.Quantity `json:"perVM,omitempty"`

	// Overrides set the quota of chosen VMs: the first override that names
	// a VM comes before the first that names its namespace only, which
	// comes before PerVM.
	// Only the BSLS's editors (cluster admins) set them; a VM's owner
	// cannot.
	// +kubebuilder:validation:MaxItems=1000
	// +listType=atomic
	// +optional
	Overrides []QuotaOverride `json:"overrides,omitempty"`

	// MeasureInterval is how often each server pod measures what each VM
	// stores, and so how late a VM that went over (or back under) its quota
	// is refused (or let write again). A measurement reads every
	// snapshot's directories, as a verification pass does. Default: 5m; at
	// least 10s.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s')",message="measureInterval is at least 10s"
	// +optional
	MeasureInterval *metav1.Duration `json:"measureInterval,omitempty"`
}

// QuotaOverride is the quota of one VM, or of every VM of a namespace.
type QuotaOverride struct {
	// Namespace of the VMs it applies to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`

	// Name of the VirtualMachine it applies to; unset: every VM of
	// Namespace that no override names.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Name string `json:"name,omitempty"`

	// PerVM is what each of these VMs may store. Unset: no bound. 0
	// refuses every write, and so does a negative value.
	// +optional
	PerVM *resource.Quantity `json:"perVM,omitempty"`
}

// StorageSpec names where the repository lives.
// +kubebuilder:validation:XValidation:rule="(has(self.filesystem) ? 1 : 0) + (has(self.s3) ? 1 : 0) + (has(self.backupStorageLocation) ? 1 : 0) == 1",message="set exactly one of storage.filesystem, storage.s3 or storage.backupStorageLocation"
type StorageSpec struct {
	// Filesystem keeps the repository on a PersistentVolumeClaim in the
	// BSLS's namespace.
	// +optional
	Filesystem *FilesystemStorage `json:"filesystem,omitempty"`

	// S3 keeps the repository in an S3-compatible bucket.
	// +optional
	S3 *S3Storage `json:"s3,omitempty"`

	// BackupStorageLocation reuses the bucket, prefix, configuration and
	// credentials of a Velero BackupStorageLocation, so storage credentials
	// are never duplicated by hand.
	// +optional
	BackupStorageLocation *BackupStorageLocationRef `json:"backupStorageLocation,omitempty"`
}

// FilesystemStorage keeps the repository on a PersistentVolumeClaim: an
// existing one, or one the controller creates from Size and StorageClassName.
// +kubebuilder:validation:XValidation:rule="!has(self.claimName) || (!has(self.size) && !has(self.storageClassName))",message="storage.filesystem.claimName uses an existing claim; size and storageClassName only apply to a claim the controller creates"
type FilesystemStorage struct {
	// ClaimName is an existing PersistentVolumeClaim in the BSLS's namespace.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +optional
	ClaimName string `json:"claimName,omitempty"`

	// Size of the claim the controller creates when ClaimName is empty.
	// Default: 10Gi.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// StorageClassName of the claim the controller creates; empty means the
	// cluster's default class.
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
}

// S3Storage keeps the repository in an S3-compatible bucket.
type S3Storage struct {
	// Bucket is the bucket's name.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket"`

	// Endpoint is the S3 endpoint as host[:port], without a scheme.
	// Default: s3.amazonaws.com.
	// +kubebuilder:validation:Pattern=`^[^\s/:]+(:[0-9]+)?$`
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// Region is the bucket's region.
	// +optional
	Region string `json:"region,omitempty"`

	// Prefix is prepended to every object the repository writes, so one
	// bucket can hold several repositories.
	// +optional
	Prefix string `json:"prefix,omitempty"`

	// CredentialsSecret is a Secret in the BSLS's namespace with the keys
	// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and optionally
	// AWS_SESSION_TOKEN). It is read only by the server pod; guests never
	// see it.
	CredentialsSecret corev1.LocalObjectReference `json:"credentialsSecret"`

	// CABundle is a PEM bundle of CAs that sign the endpoint's certificate,
	// for endpoints with a private CA.
	// +optional
	CABundle []byte `json:"caBundle,omitempty"`

	// DisableTLS talks plain HTTP to the endpoint. Only for endpoints on a
	// trusted network.
	// +optional
	DisableTLS bool `json:"disableTLS,omitempty"`
}

// BackupStorageLocationRef names a Velero BackupStorageLocation.
type BackupStorageLocationRef struct {
	// Name of the BackupStorageLocation.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`

	// Namespace of the BackupStorageLocation, usually Velero's namespace.
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`

	// Credentials is where the server pods' storage credentials come
	// from. Secret (the default): Velero's credential Secret, the BSL's
	// spec.credential or else Velero's default Secret cloud-credentials
	// (key cloud), which the server pod reads through the API, never
	// copied. WorkloadIdentity: no static keys at all, as a Velero
	// installed with --no-secret; the server pods authenticate as their
	// ServiceAccount's cloud identity (podConfig.serviceAccount.annotations)
	// through the cloud's own credential chain.
	// +kubebuilder:validation:Enum=Secret;WorkloadIdentity
	// +kubebuilder:default=Secret
	// +optional
	Credentials CredentialsSource `json:"credentials,omitempty"`
}

// CredentialsSource is where a server pod's storage credentials come from.
type CredentialsSource string

const (
	// CredentialsSecret reads static keys from a Secret.
	CredentialsSecret CredentialsSource = "Secret"
	// CredentialsWorkloadIdentity uses the pod's ambient cloud identity:
	// IRSA's web identity token, GKE's metadata server, or Azure Workload
	// Identity's federated token.
	CredentialsWorkloadIdentity CredentialsSource = "WorkloadIdentity"
)

// RepositorySpec configures the Kopia repository.
type RepositorySpec struct {
	// PasswordSecretRef is the Secret key holding the repository password.
	// When unset, the controller generates a Secret named
	// <bsls-name>-repository. The Secret is never deleted with the BSLS:
	// without it every backup in the repository is lost.
	// +optional
	PasswordSecretRef *corev1.SecretKeySelector `json:"passwordSecretRef,omitempty"`

	// PathPrefix is where the repository lives inside the storage: a
	// directory on the filesystem claim, or a key prefix after the S3 prefix.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`
	// +kubebuilder:validation:MaxLength=256
	// +optional
	PathPrefix string `json:"pathPrefix,omitempty"`

	// DefaultPolicy is the repository's global policy: applied when the
	// repository is created and, for what it sets (retention, compression),
	// again whenever it changes (the server pod restarts with it and
	// records a PolicyApplied Event on the BSLS).
	// +optional
	DefaultPolicy *PolicySpec `json:"defaultPolicy,omitempty"`

	// Maintenance is when the server pod runs Kopia's maintenance, which
	// garbage-collects the data of expired snapshots and compacts indexes.
	// The repository's maintenance owner is guestbackup's identity
	// guestbackup-maintenance@<bsls>.<namespace>. With spec.replicas above 1
	// the server pod holding the Lease <bsls>-maintenance runs it, never two
	// at once.
	// +optional
	Maintenance *MaintenanceSpec `json:"maintenance,omitempty"`
}

// MaintenanceSpec is the schedule of Kopia's quick and full maintenance
// cycles. Kopia's safety margins apply: data is deleted hours after the
// snapshots that referenced it expired, never sooner.
type MaintenanceSpec struct {
	// QuickInterval is how often quick maintenance (index compaction,
	// deleting unreferenced packs of short-lived data) runs. Default: 1h,
	// as Kopia's own.
	// +optional
	QuickInterval *metav1.Duration `json:"quickInterval,omitempty"`

	// FullInterval is how often full maintenance (garbage-collecting the
	// data of deleted snapshots) runs. Default: 24h, as Kopia's own.
	// +optional
	FullInterval *metav1.Duration `json:"fullInterval,omitempty"`

	// Disabled stops guestbackup from running maintenance, for a
	// repository whose maintenance someone else runs. Storage then grows
	// until they do. It stops verification too.
	// +optional
	Disabled bool `json:"disabled,omitempty"`

	// VerifyInterval is how often the server pod that runs maintenance
	// verifies the repository: that every content the index names is in
	// a pack the storage still holds (one listing of the packs), and that
	// VerifyReadBytes of packs, taken in turn, read back and decrypt. What
	// it finds lost is named in the RepositoryIntact condition and healed
	// forward (docs/operations.md, "Verification"). Default: 10m; 0s
	// turns verification off.
	// +optional
	VerifyInterval *metav1.Duration `json:"verifyInterval,omitempty"`

	// VerifyReadBytes is how many bytes of packs each verification pass
	// reads back from the storage; passes take the packs in turn, so a
	// repository of size S is read whole every S/VerifyReadBytes passes.
	// Default: 256Mi; 0 reads none (existence is still checked).
	// +optional
	VerifyReadBytes *resource.Quantity `json:"verifyReadBytes,omitempty"`
}

// PolicySpec is the part of a Kopia policy an admin sets for every guest.
type PolicySpec struct {
	// Retention says how many snapshots of each age to keep.
	// +optional
	Retention *RetentionPolicy `json:"retention,omitempty"`

	// Compression is the compressor for new data; "none" stores it as is.
	// +kubebuilder:validation:Enum=none;zstd;zstd-fastest;zstd-better-compression;s2-default;s2-better;pgzip;gzip;deflate-default
	// +optional
	Compression string `json:"compression,omitempty"`
}

// RetentionPolicy is Kopia's retention: how many snapshots to keep per period.
type RetentionPolicy struct {
	// KeepLatest keeps the newest N snapshots.
	// +kubebuilder:validation:Minimum=0
	// +optional
	KeepLatest *int32 `json:"keepLatest,omitempty"`
	// KeepHourly keeps the newest snapshot of each of the last N hours.
	// +kubebuilder:validation:Minimum=0
	// +optional
	KeepHourly *int32 `json:"keepHourly,omitempty"`
	// KeepDaily keeps the newest snapshot of each of the last N days.
	// +kubebuilder:validation:Minimum=0
	// +optional
	KeepDaily *int32 `json:"keepDaily,omitempty"`
	// KeepWeekly keeps the newest snapshot of each of the last N weeks.
	// +kubebuilder:validation:Minimum=0
	// +optional
	KeepWeekly *int32 `json:"keepWeekly,omitempty"`
	// KeepMonthly keeps the newest snapshot of each of the last N months.
	// +kubebuilder:validation:Minimum=0
	// +optional
	KeepMonthly *int32 `json:"keepMonthly,omitempty"`
	// KeepAnnual keeps the newest snapshot of each of the last N years.
	// +kubebuilder:validation:Minimum=0
	// +optional
	KeepAnnual *int32 `json:"keepAnnual,omitempty"`
}

// TLSSpec chooses where the server's certificate comes from.
// +kubebuilder:validation:XValidation:rule="!(has(self.issuerRef) && has(self.secretName))",message="set at most one of tls.issuerRef and tls.secretName"
type TLSSpec struct {
	// IssuerRef is the cert-manager Issuer or ClusterIssuer that signs the
	// server's certificate, instead of a CA of this BSLS's own. Its guests
	// then trust every certificate that issuer signs: whoever may request
	// certificates from it (any namespace's Certificates, for a
	// ClusterIssuer) can impersonate this server to them.
	// +optional
	IssuerRef *IssuerReference `json:"issuerRef,omitempty"`

	// SecretName is a kubernetes.io/tls Secret in the BSLS's namespace,
	// managed by the admin, with tls.crt, tls.key and ca.crt. Guests trust
	// ca.crt, and so whatever else that CA signs; tls.crt must name the
	// endpoint's host.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	SecretName string `json:"secretName,omitempty"`
}

// IssuerReference names a cert-manager issuer.
type IssuerReference struct {
	// Name of the issuer.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`

	// Kind of the issuer.
	// +kubebuilder:validation:Enum=Issuer;ClusterIssuer
	// +kubebuilder:default=ClusterIssuer
	// +optional
	Kind string `json:"kind,omitempty"`

	// Group of the issuer, for external issuers.
	// +kubebuilder:default=cert-manager.io
	// +optional
	Group string `json:"group,omitempty"`
}

// AccessSpec decides which VMs may use the server and what their guests may do.
type AccessSpec struct {
	// NamespaceSelector selects the namespaces whose VirtualMachines may use
	// this server. When unset, only VMs in the BSLS's own namespace may; an
	// empty selector ({}) admits every namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// AppendOnly lets guests create and read their own snapshots but not
	// delete them, so a compromised guest cannot erase its history.
	// +optional
	AppendOnly bool `json:"appendOnly,omitempty"`

	// ClientIPBlocks are address ranges the server's NetworkPolicy admits
	// besides the pods of the allowed namespaces: guests that reach the
	// server from outside the pod network, through a NodePort or
	// LoadBalancer Service (see clientURL), such as VMs on a bridged or
	// secondary (Multus) network. An enforcing CNI sees such a connection
	// from the guest's own address when the Service keeps client addresses
	// (externalTrafficPolicy: Local, or a load balancer that preserves
	// them), and from a node's address otherwise: list the guests'
	// network, the nodes' network, or both. Each range admits every address
	// in it to the server's port, which still requires a guest's password;
	// the namespaceSelector alone decides which VMs get credentials.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	ClientIPBlocks []IPBlock `json:"clientIPBlocks,omitempty"`

	// PasswordHash is how guests' passwords are hashed for the server to
	// verify them: scrypt (Kopia's default; about 134 ms and 64 MiB per
	// login measured on the test bed) or pbkdf2 (PBKDF2-HMAC-SHA256 with
	// 600,000 iterations, about 83 ms and no extra memory per login, built
	// only of FIPS 140-approved primitives). The server verifies one login
	// at a time, so the choice bounds logins per second per replica.
	// Changing it applies to passwords issued from then on (new VMs and
	// rotations): every existing user keeps its hash and keeps logging in,
	// since Kopia reads the algorithm from each user's own hash. Rotate a
	// VM's credentials to move it to the new algorithm. Default: scrypt.
	// +kubebuilder:validation:Enum=scrypt;pbkdf2
	// +optional
	PasswordHash PasswordHash `json:"passwordHash,omitempty"`
}

// IPBlock is a range of client addresses, as a NetworkPolicy's ipBlock.
// +kubebuilder:validation:XValidation:rule="!has(self.except) || self.except.all(e, !isCIDR(self.cidr) || !isCIDR(e) || (cidr(self.cidr).containsCIDR(e) && cidr(e).prefixLength() > cidr(self.cidr).prefixLength()))",message="each range of except must lie strictly inside cidr"
type IPBlock struct {
	// CIDR is the range, IPv4 or IPv6, e.g. 192.168.10.0/24 or 2001:db8::/64.
	// +kubebuilder:validation:Format=cidr
	// +kubebuilder:validation:MaxLength=43
	CIDR string `json:"cidr"`

	// Except are ranges inside CIDR that are not admitted.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:Format=cidr
	// +kubebuilder:validation:items:MaxLength=43
	// +listType=atomic
	// +optional
	Except []string `json:"except,omitempty"`
}

// PasswordHash names the algorithm a BSLS's user passwords are hashed with.
type PasswordHash string

const (
	// PasswordHashScrypt is scrypt N=65536 r=8 p=1, Kopia's default.
	PasswordHashScrypt PasswordHash = "scrypt"
	// PasswordHashPBKDF2 is PBKDF2-HMAC-SHA256 with 600,000 iterations.
	PasswordHashPBKDF2 PasswordHash = "pbkdf2"
)

// ServiceSpec configures the Service in front of the server.
type ServiceSpec struct {
	// Type of the Service.
	// +kubebuilder:validation:Enum=ClusterIP;NodePort;LoadBalancer
	// +kubebuilder:default=ClusterIP
	// +optional
	Type corev1.ServiceType `json:"type,omitempty"`

	// Port the Service exposes.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:default=51515
	// +optional
	Port int32 `json:"port,omitempty"`

	// Annotations added to the Service, e.g. for a cloud load balancer.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PodConfig configures the server pods.
type PodConfig struct {
	// Resources of the server container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// NodeSelector constrains the nodes the server runs on.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations of the server pods.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Affinity of the server pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// PriorityClassName of the server pods.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// ServiceAccount configures the server pods' ServiceAccount,
	// <bsls>-server, which the controller keeps: the cloud identity they
	// reach storage as.
	// +optional
	ServiceAccount ServerServiceAccount `json:"serviceAccount,omitempty"`
}

// ServerServiceAccount configures the server pods' ServiceAccount.
type ServerServiceAccount struct {
	// Annotations on the ServiceAccount, for a cloud's workload identity:
	// eks.amazonaws.com/role-arn (IRSA), iam.gke.io/gcp-service-account
	// (GKE Workload Identity) or azure.workload.identity/client-id (Azure
	// Workload Identity, whose webhook only admits pods labelled
	// azure.workload.identity/use: "true": the server pods get that label
	// when this annotation is set). The storage then needs no static keys:
	// see storage.backupStorageLocation.credentials.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// BackupStorageLocationServerStatus is what the controller observed.
type BackupStorageLocationServerStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, RepositoryReady, CertificateReady, ServerAvailable,
	// UsersSynced, StorageAvailable, StorageSpace and RepositoryIntact.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Endpoint is the URL guests connect to.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// TLSCA is the PEM of the CA certificates (ca.crt) that sign the
	// server's certificate. Guests trust these and nothing else: Kopia
	// verifies the server's chain to them and the endpoint's host name in
	// the certificate. It survives renewals of the leaf. While the CA
	// rotates (CARotation), it holds the next CA too, after the current.
	// +optional
	TLSCA string `json:"tlsCA,omitempty"`

	// CARotation is the rotation of the BSLS's own CA under way: asked for
	// by annotating Secret <bsls>-ca guestbackup.io/rotate-ca. Guests are
	// given the next CA beside the current one (TLSCA), and the server
	// switches to it once no VM runs a guest that booted without it.
	// +optional
	CARotation *CARotationStatus `json:"caRotation,omitempty"`

	// TLSFingerprint is the SHA-256 of the first certificate of TLSCA (DER,
	// hex), for comparing CAs by eye. Guests do not pin it: Kopia's
	// fingerprint check accepts any chain that merely contains the
	// certificate (docs/security.md).
	// +optional
	TLSFingerprint string `json:"tlsFingerprint,omitempty"`

	// Users is the number of guest users provisioned in the repository.
	// +optional
	Users int32 `json:"users,omitempty"`

	// Maintenance is what the server pod last reported of the repository's
	// maintenance.
	// +optional
	Maintenance *MaintenanceStatus `json:"maintenance,omitempty"`

	// Integrity is what the server pod that runs maintenance last found
	// when it verified the repository: whether the storage still holds
	// every content the index names and whether what it read back
	// decrypts, and which snapshots reference data the storage lost
	// (condition RepositoryIntact; docs/design.md, decision 27). Unset before
	// the pod published a verification.
	// +optional
	Integrity *IntegrityStatus `json:"integrity,omitempty"`

	// Namespaces is the number of namespaces whose VMs have users on this
	// server. Above one, they share the repository's deduplication: a guest
	// can learn whether content exists in another namespace's backups (see
	// docs/security.md). One BSLS per trust domain.
	// +optional
	Namespaces int32 `json:"namespaces,omitempty"`

	// RepositoryOpened is when a server pod first opened the repository.
	// From then on the repository exists, and the controller never
	// generates a repository password again: a missing password Secret is
	// reported (RepositoryPasswordLost) so that the admin restores it.
	// +optional
	RepositoryOpened *metav1.Time `json:"repositoryOpened,omitempty"`

	// Client is the kopia client the server pod hands out to guests that
	// have none of its build (docs/design.md, decision 18), as its server pod
	// published it: the bootstrap carries its SHA-256, and a guest runs
	// only a binary that matches it.
	// +optional
	Client *ClientStatus `json:"client,omitempty"`

	// RequestPollInterval is how often the guests' bootstraps have them
	// poll for requests; unset: the server carries no requests (their API
	// is not installed, or the server hands out no client port yet).
	// +optional
	RequestPollInterval *metav1.Duration `json:"requestPollInterval,omitempty"`

	// Quota is what the server pods' last measurement found of the VMs over
	// their quota (spec.quota). Unset while no quota is set or before a
	// measurement was published.
	// +optional
	Quota *QuotaStatus `json:"quota,omitempty"`
}

// QuotaStatus is the last measurement of what the VMs store against their
// quota. The list is bounded; the count stays exact.
type QuotaStatus struct {
	// MeasuredAt is when the measurement ended.
	// +optional
	MeasuredAt *metav1.Time `json:"measuredAt,omitempty"`

	// Failure is why the last measurement could not complete; the other
	// fields are then those of the last complete one.
	// +optional
	Failure string `json:"failure,omitempty"`

	// VMsOverQuota is how many VMs store more than their quota: their
	// guests' writes are refused.
	// +optional
	VMsOverQuota int32 `json:"vmsOverQuota,omitempty"`

	// OverQuota are those VMs, the most over first (at most 100).
	// +kubebuilder:validation:MaxItems=100
	// +listType=atomic
	// +optional
	OverQuota []VMQuotaUse `json:"overQuota,omitempty"`
}

// VMQuotaUse is what one VM stores against its quota.
type VMQuotaUse struct {
	// VM is the VirtualMachine, as <namespace>/<name>.
	VM string `json:"vm"`
	// UsedBytes is what it stores.
	UsedBytes int64 `json:"usedBytes"`
	// QuotaBytes is its quota.
	QuotaBytes int64 `json:"quotaBytes"`
}

// ClientStatus is the kopia client binary a BSLS's server pod serves to its
// guests, over the same TLS endpoint and CA as the server.
type ClientStatus struct {
	// Version is the kopia version of the binaries, e.g. v0.23.1.
	// +optional
	Version string `json:"version,omitempty"`

	// URL is where guests download it: the endpoint's host, the server's
	// port plus one; /kopia/linux-<arch> below it.
	// +optional
	URL string `json:"url,omitempty"`

	// SHA256 is the SHA-256 (hex) of the binary for each architecture
	// (GOARCH: amd64, arm64) the server pod serves.
	// +optional
	SHA256 map[string]string `json:"sha256,omitempty"`
}

// DefaultRequestPollInterval is spec.requestPollInterval's default.
const DefaultRequestPollInterval = 30 * time.Second

// BackupStorageLocationServer runs a managed Kopia repository server that
// VirtualMachines opt into with the guestbackup.io/server annotation.
// CARotationStatus is where a deliberate rotation of a BSLS's own CA
// stands.
type CARotationStatus struct {
	// NextFingerprint is the SHA-256 of the CA the server switches to (DER,
	// hex).
	NextFingerprint string `json:"nextFingerprint"`
	// Reason is the admin's, from the annotation that asked for it.
	// +optional
	Reason string `json:"reason,omitempty"`
	// StartTime is when guests were first given the next CA.
	StartTime metav1.Time `json:"startTime"`
	// Waiting is how many VMs run a guest that may not trust the next CA
	// yet (it started before its bootstrap carried it), and how many
	// BackupClients' workloads may not (their Secret has carried it for
	// less than the clients' overlap, 24 hours by default). The server
	// switches when none may.
	Waiting int32 `json:"waiting"`
	// WaitingVMs names some of those VMs, namespace/name (at most 20):
	// restart them (virtctl restart) to finish the rotation.
	// +optional
	WaitingVMs []string `json:"waitingVMs,omitempty"`
	// WaitingClients names some of those BackupClients, namespace/name (at
	// most 20): restart their workloads.
	// +optional
	WaitingClients []string `json:"waitingClients,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bsls,categories=guestbackup
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`
// +kubebuilder:printcolumn:name="Users",type=integer,JSONPath=`.status.users`
// +kubebuilder:printcolumn:name="Namespaces",type=integer,JSONPath=`.status.namespaces`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BackupStorageLocationServer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BackupStorageLocationServerSpec   `json:"spec"`
	Status BackupStorageLocationServerStatus `json:"status,omitempty"`
}

// BackupStorageLocationServerList is a list of BackupStorageLocationServers.
// +kubebuilder:object:root=true
type BackupStorageLocationServerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackupStorageLocationServer `json:"items"`
}

func init() {
	SchemeBuilder.Register(&BackupStorageLocationServer{}, &BackupStorageLocationServerList{})
}

// MaintenanceStatus is the repository's maintenance, as the server pod ran
// it: Kopia's schedule and guestbackup's last run.
type MaintenanceStatus struct {
	// Owner is the repository's maintenance owner (user@host). Maintenance
	// runs only when it is guestbackup's, guestbackup-maintenance@<bsls>.<namespace>.
	// +optional
	Owner string `json:"owner,omitempty"`

	// LastRun is when the last run ended, whatever its outcome.
	// +optional
	LastRun *metav1.Time `json:"lastRun,omitempty"`

	// LastCycle is the cycle of the last run: quick or full.
	// +optional
	LastCycle string `json:"lastCycle,omitempty"`

	// LastSuccess is when the last successful run ended.
	// +optional
	LastSuccess *metav1.Time `json:"lastSuccess,omitempty"`

	// NextRun is when Kopia's schedule has the next cycle due.
	// +optional
	NextRun *metav1.Time `json:"nextRun,omitempty"`

	// Failure is why the last run failed, or why maintenance cannot run;
	// empty when it succeeded.
	// +optional
	Failure string `json:"failure,omitempty"`
}

// IntegrityStatus is the repository's last verification, as the server pod
// that runs maintenance published it. Lists are bounded so that the status
// stays small whatever the storage lost; the counts stay exact.
type IntegrityStatus struct {
	// LastChecked is when the last verification pass ended, whatever its
	// outcome.
	// +optional
	LastChecked *metav1.Time `json:"lastChecked,omitempty"`

	// LastVerified is when the last complete pass ended; unset before one
	// did.
	// +optional
	LastVerified *metav1.Time `json:"lastVerified,omitempty"`

	// Failure is why the last pass could not complete (the storage did not
	// answer, say), or why what the server pod published cannot be read;
	// the other fields are then those of the last complete pass (kept from
	// before when the pod knows none, as after its restart). Empty when the
	// last pass completed.
	// +optional
	Failure string `json:"failure,omitempty"`

	// Contents is how many contents the index names that the last complete
	// pass found present.
	// +optional
	Contents int64 `json:"contents,omitempty"`

	// Packs is how many packs hold those contents.
	// +optional
	Packs int64 `json:"packs,omitempty"`

	// ReadPacks is how many packs the last complete pass read back and
	// decrypted, content by content: a bounded sample at each pass.
	// +optional
	ReadPacks int64 `json:"readPacks,omitempty"`

	// ReadBytes is the size of the packs the last complete pass read back.
	// +optional
	ReadBytes int64 `json:"readBytes,omitempty"`

	// MissingPacks are packs the index named that the storage no longer
	// had: those the last complete pass found, or, while snapshots stay
	// damaged, those the pass that found the loss named (at most 20: more
	// may be missing when 20 are listed).
	// +kubebuilder:validation:MaxItems=20
	// +listType=atomic
	// +optional
	MissingPacks []string `json:"missingPacks,omitempty"`

	// DamagedPacks are packs holding a content that did not read back,
	// found and kept as MissingPacks are (at most 20).
	// +kubebuilder:validation:MaxItems=20
	// +listType=atomic
	// +optional
	DamagedPacks []string `json:"damagedPacks,omitempty"`

	// LostContents is how many contents the last complete pass found lost.
	// They were dropped from the index, so that the next snapshot of the
	// same data uploads them again.
	// +optional
	LostContents int64 `json:"lostContents,omitempty"`

	// PendingContents is how many lost contents are still in the index,
	// marked deleted, because Kopia's garbage collection keeps its deletion
	// watermark behind them: a guest's client takes them for present and
	// does not upload them again until Kopia's maintenance lets go of them
	// (at most its safety margins, a day or two).
	// +optional
	PendingContents int64 `json:"pendingContents,omitempty"`

	// DamagedSnapshots is how many snapshots reference a lost content now:
	// they cannot be restored whole. Zero once every one healed or expired.
	// +optional
	DamagedSnapshots int64 `json:"damagedSnapshots,omitempty"`

	// DamagedSince is when the repository was last found damaged after
	// being intact; unset while no snapshot is damaged.
	// +optional
	DamagedSince *metav1.Time `json:"damagedSince,omitempty"`

	// Damaged are the backed-up paths of VMs with damaged snapshots, the
	// most recently damaged first, at most 1000: when the sum of their
	// snapshots is below DamagedSnapshots the list is truncated (the
	// RepositoryIntact message says so).
	// +kubebuilder:validation:MaxItems=1000
	// +listType=atomic
	// +optional
	Damaged []DamagedVM `json:"damaged,omitempty"`

	// Settled are the paths whose damaged snapshots the last complete pass
	// found could no longer heal (the guest's latest snapshot is whole, or
	// the repository had been damaged for a week) and rewrote: each lost
	// file replaced by a stub, .INVALID.<name>, naming what was lost, so
	// that they restore every other file and Kopia's garbage collection
	// runs again. Their counts and IDs are of before the rewrite (the
	// snapshots' IDs changed); at most 1000, listed by the settling pass
	// only.
	// +kubebuilder:validation:MaxItems=1000
	// +listType=atomic
	// +optional
	Settled []DamagedVM `json:"settled,omitempty"`
}

// DamagedVM is one backed-up path of one VM with snapshots that cannot be
// restored whole: they reference data the storage lost (or, in Settled,
// did, until they were rewritten).
type DamagedVM struct {
	// Namespace is the VM's namespace: the host of its Kopia identity
	// <name>@<namespace>.
	Namespace string `json:"namespace"`

	// Name is the VM's name: the user of its Kopia identity.
	Name string `json:"name"`

	// Path is the backed-up path in the guest.
	Path string `json:"path"`

	// Snapshots is how many of the path's snapshots are damaged.
	Snapshots int64 `json:"snapshots"`

	// Files is how many files those snapshots miss data of, each file
	// counted once.
	// +optional
	Files int64 `json:"files,omitempty"`

	// Oldest is the start time of the first damaged snapshot.
	// +optional
	Oldest *metav1.Time `json:"oldest,omitempty"`

	// Newest is the start time of the last damaged snapshot.
	// +optional
	Newest *metav1.Time `json:"newest,omitempty"`

	// IDs are the IDs of up to 3 of the most recent damaged snapshots.
	// +kubebuilder:validation:MaxItems=3
	// +listType=atomic
	// +optional
	IDs []string `json:"ids,omitempty"`

	// Healing is true while the path's latest snapshot is damaged: the
	// guest reads every file again at its next snapshot, which uploads
	// again what was lost of the files that did not change. False: the
	// latest snapshot is whole, so these cannot heal that way, and the
	// server pod settles them (Settled).
	// +optional
	Healing bool `json:"healing,omitempty"`
}
