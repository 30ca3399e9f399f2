package v1alpha1

// Condition types of a BackupStorageLocationServer.
const (
	// ConditionReady is True when guests can connect: every other condition is True.
	ConditionReady = "Ready"
	// ConditionRepositoryReady is True when the repository exists and the server can open it.
	ConditionRepositoryReady = "RepositoryReady"
	// ConditionCertificateReady is True when the server's certificate and CA are issued.
	ConditionCertificateReady = "CertificateReady"
	// ConditionServerAvailable is True when the server Deployment has an available replica.
	ConditionServerAvailable = "ServerAvailable"
	// ConditionUsersSynced is True when the repository's users match the per-VM Secrets.
	ConditionUsersSynced = "UsersSynced"
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
)

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
