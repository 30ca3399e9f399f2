package kopiaserver

// Reasons of a BSLS's conditions. Each names what happened in words an admin
// can search for; the condition's message says what to do about it.
const (
	// ReasonStorageResolved: the storage, its credentials and the repository
	// password are in place; the server pod opens the repository.
	ReasonStorageResolved = "StorageResolved"
	// ReasonRepositoryOpened: a server pod opened (or created) the repository.
	ReasonRepositoryOpened = "RepositoryOpened"
	// ReasonClaimNotFound: storage.filesystem.claimName names no claim.
	ReasonClaimNotFound = "ClaimNotFound"
	// ReasonCredentialsInvalid: the S3 or Velero credentials Secret is
	// missing or lacks a key.
	ReasonCredentialsInvalid = "CredentialsInvalid"
	// ReasonBackupStorageLocationInvalid: the Velero BackupStorageLocation is
	// missing or cannot be used.
	ReasonBackupStorageLocationInvalid = "BackupStorageLocationInvalid"
	// ReasonPasswordSecretInvalid: repository.passwordSecretRef names a
	// missing Secret or key.
	ReasonPasswordSecretInvalid = "PasswordSecretInvalid"
	// ReasonRepositoryInitFailed: the server pod's init container, which
	// opens or creates the repository, failed.
	ReasonRepositoryInitFailed = "RepositoryInitFailed"
	// ReasonRepositoryPasswordLost: the generated password Secret is gone
	// but the repository was opened with it (status.repositoryOpened): only
	// that password opens the repository, so none is generated; the admin
	// restores the Secret from a backup.
	ReasonRepositoryPasswordLost = "RepositoryPasswordLost"
	// ReasonVeleroConsentRequired: the Velero BackupStorageLocation does not
	// list this BSLS in its guestbackup.io/allowed-servers annotation, so
	// its server is given no access to Velero's credentials.
	ReasonVeleroConsentRequired = "VeleroConsentRequired"

	// ReasonCertificateIssued: the serving certificate and its CA are ready.
	ReasonCertificateIssued = "CertificateIssued"
	// ReasonCertificatePending: cert-manager has not issued the certificate yet.
	ReasonCertificatePending = "CertificatePending"
	// ReasonCertManagerMissing: tls.issuerRef is set but cert-manager's
	// CRDs are not installed.
	ReasonCertManagerMissing = "CertManagerMissing"
	// ReasonTLSSecretNotFound: the certificate Secret does not exist.
	ReasonTLSSecretNotFound = "TLSSecretNotFound"
	// ReasonTLSSecretInvalid: the certificate Secret lacks a key or its
	// certificate does not verify against its CA.
	ReasonTLSSecretInvalid = "TLSSecretInvalid"

	// ReasonServerAvailable: a server pod is ready.
	ReasonServerAvailable = "ServerAvailable"
	// ReasonServerStarting: the server Deployment has no ready pod yet.
	ReasonServerStarting = "ServerStarting"
	// ReasonScaledToZero: spec.replicas is 0.
	ReasonScaledToZero = "ScaledToZero"
	// ReasonWaitingForPrerequisites: the server is not started until its
	// storage and certificate are in place.
	ReasonWaitingForPrerequisites = "WaitingForPrerequisites"

	// ReasonUsersSynced: every allowed VM's user is written and the server
	// applied them.
	ReasonUsersSynced = "UsersSynced"
	// ReasonHashPending: some VMs' passwords are not hashed yet.
	ReasonHashPending = "HashPending"
	// ReasonWaitingForServer: users are written; no server applied them yet.
	ReasonWaitingForServer = "WaitingForServer"

	// ReasonReady: guests can connect.
	ReasonReady = "Ready"
	// ReasonNotReady: at least one other condition is not True.
	ReasonNotReady = "NotReady"
)

// Reasons of the Events the controller records on a BSLS besides its
// condition changes (docs/events.md).
const (
	// ReasonUserRefused (Warning): a credential Secret names this server
	// but gets no user on it: its namespace is not selected, its VM does
	// not exist or names another server, another object controls it, or
	// its labels or username key claim an identity its VM would not get.
	ReasonUserRefused = "UserRefused"
	// ReasonClaimCreated (Normal): the repository's PersistentVolumeClaim
	// was created; it outlives the BSLS.
	ReasonClaimCreated = "ClaimCreated"
	// ReasonRepositoryPasswordGenerated (Normal): a repository password
	// was generated for a repository never opened; the admin should back
	// it up.
	ReasonRepositoryPasswordGenerated = "RepositoryPasswordGenerated"
	// ReasonCAIssued (Normal): the controller issued the BSLS's own CA.
	ReasonCAIssued = "CAIssued"
	// ReasonServingCertificateIssued (Normal): the controller issued the
	// server's certificate from the BSLS's own CA.
	ReasonServingCertificateIssued = "ServingCertificateIssued"
	// ReasonSharedAcrossNamespaces (Warning): the BSLS started serving VMs
	// of more than one namespace, which share the repository's
	// deduplication (DESIGN.md decision 14).
	ReasonSharedAcrossNamespaces = "SharedAcrossNamespaces"
)

// problem is why a step cannot go on: a condition's reason and a message
// that names the object at fault and the fix.
type problem struct {
	Reason  string
	Message string
}
