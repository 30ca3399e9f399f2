package v1alpha1

// Condition types of a BackupStorageLocationServer.
const (
	// ConditionReady is True when guests can connect: every other condition is True
	// (StorageAvailable and RepositoryIntact: not False; StorageSpace: not StorageFull).
	ConditionReady = "Ready"
	// ConditionRepositoryReady is True when the repository exists and the server can open it.
	ConditionRepositoryReady = "RepositoryReady"
	// ConditionCertificateReady is True when the server's certificate and CA are issued.
	ConditionCertificateReady = "CertificateReady"
	// ConditionServerAvailable is True when the server Deployment has an available replica.
	ConditionServerAvailable = "ServerAvailable"
	// ConditionUsersSynced is True when the repository's users match the per-VM Secrets.
	ConditionUsersSynced = "UsersSynced"
	// ConditionStorageAvailable is False while a server pod's periodic check of the
	// repository's storage fails, with the storage's own error.
	ConditionStorageAvailable = "StorageAvailable"
	// ConditionRepositoryIntact is False while the server pod's verification of the
	// repository finds snapshots that reference data the storage lost; Unknown before a
	// verification completed.
	ConditionRepositoryIntact = "RepositoryIntact"
	// ConditionStorageSpace is False while the repository's storage is low on space
	// (LowSpace, a warning: Ready stays True) or full (StorageFull: it refused a server
	// pod's write for want of space, or its volume has no byte free; Ready is False);
	// Unknown where the storage cannot tell its space (S3) and refused no write.
	ConditionStorageSpace = "StorageSpace"
)

// AnnotationPrefix prefixes every annotation guestbackup reads or writes.
const AnnotationPrefix = "guestbackup.io/"

// Annotations on a VirtualMachine.
const (
	// AnnotationServer opts a VM in: its value is <namespace>/<bsls-name>.
	AnnotationServer = AnnotationPrefix + "server"
	// AnnotationMode chooses how the bootstrap reaches the guest: "cloud-init" or "disk".
	AnnotationMode = AnnotationPrefix + "mode"
	// AnnotationPaths lists what the guest snapshots.
	AnnotationPaths = AnnotationPrefix + "paths"
	// AnnotationSchedule is when the guest snapshots Paths (a systemd calendar expression).
	AnnotationSchedule = AnnotationPrefix + "schedule"
	// AnnotationRotate issues new credentials whenever its value changes.
	AnnotationRotate = AnnotationPrefix + "rotate"
	// AnnotationStatus is written by the webhook: JSON of what was injected, never a secret.
	AnnotationStatus = AnnotationPrefix + "status"
	// AnnotationRestoreFrom names another VM of the same namespace (which
	// may be deleted) whose snapshots this VM's guest may read, read-only,
	// until the annotation is removed.
	AnnotationRestoreFrom = AnnotationPrefix + "restore-from"
)

// AnnotationAllowedServers is set by a Velero admin on a Velero
// BackupStorageLocation to consent to BSLSs reusing it (and so reading its
// credential Secret): a comma-separated list of <namespace>/<name> of
// BackupStorageLocationServers. Names only, no patterns: consent is given
// to a server whose author the Velero admin knows.
const AnnotationAllowedServers = AnnotationPrefix + "allowed-servers"

// Labels on a per-VM credential Secret.
const (
	// LabelManagedBy marks objects guestbackup manages; its value is ManagedByValue.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is the value of LabelManagedBy on guestbackup's objects.
	ManagedByValue = "guestbackup"
	// LabelVM names the VirtualMachine a Secret belongs to.
	LabelVM = "guestbackup.io/vm"
	// LabelServerNamespace is the namespace of the BSLS a Secret's user lives on.
	LabelServerNamespace = "guestbackup.io/server-namespace"
	// LabelServerName is the name of the BSLS a Secret's user lives on.
	LabelServerName = "guestbackup.io/server-name"
)

// CredentialSecretName is the per-VM credential Secret of a VM, in the
// VM's namespace: written by the webhook, adopted by the controller.
func CredentialSecretName(vmName string) string { return vmName + "-guestbackup" }

// AnnotationIssuedAt on a per-VM credential Secret is when the webhook
// issued its current credentials (RFC 3339): provisioning is measured from it.
const AnnotationIssuedAt = AnnotationPrefix + "issued-at"

// Keys of a per-VM credential Secret. The webhook writes the first three; the
// controller adds the hash, once per generation, for the server's user sync.
const (
	// SecretKeyUsername holds the VM's Kopia identity, <vm>@<namespace>.
	SecretKeyUsername = "username"
	// SecretKeyPassword holds the VM's Kopia password.
	SecretKeyPassword = "password"
	// SecretKeyGeneration is bumped whenever the password is rotated.
	SecretKeyGeneration = "generation"
	// SecretKeyPasswordHash is the password hashed as Kopia stores it.
	SecretKeyPasswordHash = "passwordHash"
	// SecretKeyPasswordHashGeneration is the generation the hash was computed for.
	SecretKeyPasswordHashGeneration = "passwordHashGeneration"
)

// Payload keys of a per-VM credential Secret.
const (
	// SecretKeyUserData is the cloud-init user-data, the key KubeVirt reads
	// for a cloudInitNoCloud secretRef (modes cloud-init and merged).
	SecretKeyUserData = "userdata"
	// SecretKeyInstall is the disk-mode payload's installer: in mode disk
	// the Secret's keys are the bootstrap's files (its "password" key is
	// the one above), and the guest's one-time unit runs install.sh from
	// the mounted disk to put them in place.
	SecretKeyInstall = "install.sh"
)

// Injection modes, the values of the guestbackup.io/mode annotation and of
// InjectionStatus.Mode.
const (
	// ModeCloudInit delivers the bootstrap as cloud-init user-data.
	ModeCloudInit = "cloud-init"
	// ModeDisk delivers the bootstrap as a secret disk the guest mounts.
	ModeDisk = "disk"
)

// InjectionStatus is the JSON value of the guestbackup.io/status annotation:
// what the webhook injected, so that re-admission injects nothing twice and
// opting out removes exactly that. It never holds a secret.
type InjectionStatus struct {
	// Mode is ModeCloudInit or ModeDisk.
	Mode string `json:"mode"`
	// Server is the <namespace>/<name> of the BSLS the credentials are for.
	Server string `json:"server"`
	// Secret is the per-VM credential Secret, in the VM's namespace.
	Secret string `json:"secret"`
	// User is the VM's Kopia identity, <vm>@<namespace>.
	User string `json:"user"`
	// Generation of the credentials; bumped by every rotation.
	Generation int64 `json:"generation"`
	// Rotate is the guestbackup.io/rotate value the credentials were issued for.
	Rotate string `json:"rotate,omitempty"`
	// Volume and Disk are the names of what was added to the VM template.
	// In merged cloud-init, Volume is the VM's own NoCloud volume.
	Volume string `json:"volume"`
	Disk   string `json:"disk,omitempty"`
	// MergedFrom is set when the VM's own inline user-data was moved into
	// the Secret: "userData" or "userDataBase64", the field it came from
	// and is restored to when the VM opts out.
	MergedFrom string `json:"mergedFrom,omitempty"`
}
