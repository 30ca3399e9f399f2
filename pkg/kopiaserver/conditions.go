package kopiaserver

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/units"
)

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
	// ReasonStorageNotShared: spec.replicas is above 1 but the claim is
	// not ReadWriteMany, so not every server pod could mount it.
	ReasonStorageNotShared = "StorageNotShared"
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
	// ReasonUsersNotApplied: a server pod could not apply the users to
	// the repository (a full or failing storage): users added since
	// cannot log in through it; the message carries the storage's words.
	ReasonUsersNotApplied = "UsersNotApplied"

	// ReasonStorageReachable: every server pod's last check of the
	// repository's storage reached it.
	ReasonStorageReachable = "StorageReachable"
	// ReasonStorageUnavailable: a server pod's last check of the storage
	// failed; the message carries the storage's own error.
	ReasonStorageUnavailable = "StorageUnavailable"
	// ReasonStorageNotChecked: no server pod has checked the storage yet.
	ReasonStorageNotChecked = "StorageNotChecked"

	// ReasonSufficient: the repository's volume has at least
	// LowSpacePercent of its capacity free, and the storage refused no
	// server pod's write for want of space.
	ReasonSufficient = "Sufficient"
	// ReasonLowSpace: the repository's volume has less than
	// LowSpacePercent of its capacity free: a warning, Ready stays True;
	// the message says how much is free and how to make room.
	ReasonLowSpace = "LowSpace"
	// ReasonStorageFull: the storage refused a server pod's write for want
	// of space (a full volume, an S3 quota), or the volume has no byte
	// free: guests' snapshots fail, and Ready is False.
	ReasonStorageFull = "StorageFull"
	// ReasonNotMeasured: no server pod measured the storage's space
	// lately (storage that cannot tell, such as S3, or pods of an older
	// guestbackup), and none had a write refused for want of space.
	ReasonNotMeasured = "NotMeasured"

	// ReasonIntact: the last verification of the repository found every
	// content the index names in a pack the storage holds, and no snapshot
	// that references lost data.
	ReasonIntact = "Intact"
	// ReasonContentsLost: the last complete verification found contents
	// lost (packs missing from the storage, or not reading back), or
	// snapshots that reference lost contents: the message names the
	// packs, how many snapshots of how many VMs are damaged, and how they
	// heal.
	ReasonContentsLost = "ContentsLost"
	// ReasonNotVerified: no verification of the repository is published
	// yet (a new BSLS, or a server pod of an older guestbackup), or
	// verification is turned off.
	ReasonNotVerified = "NotVerified"
	// ReasonVerificationFailed: the last verification could not complete,
	// or what the server pod published of it cannot be read; the message
	// carries the error and what the last complete pass found.
	ReasonVerificationFailed = "VerificationFailed"

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
	// ReasonCASecretRemade (Warning): Secret <bsls>-ca was gone without a
	// deletion the guard saw, and the controller made the CA guests pin
	// again from its key derived from the repository password.
	ReasonCASecretRemade = "CASecretRemade"
	// ReasonCASecretRestored (Warning): Secret <bsls>-ca was deleted
	// without guestbackup.io/replace-ca, and the controller re-created it
	// with the same certificate and key, so running guests keep trusting
	// the server.
	ReasonCASecretRestored = "CASecretRestored"
	// ReasonCAChanged (Warning): the CA guests are given to trust
	// (status.tlsCA) is another one: running guests refuse the server
	// until their VM restarts with the re-rendered bootstrap.
	ReasonCAChanged = "CAChanged"
	// ReasonCARescueIgnored (Warning): Secret <bsls>-ca-rescue is not a
	// copy the controller made of the CA guests trust (not guestbackup's,
	// another CA, unreadable): it is never written into Secret <bsls>-ca.
	ReasonCARescueIgnored = "CARescueIgnored"
	// ReasonCARescueAbandoned (Warning): Secret <bsls>-ca was deleted and
	// written again with another CA before the controller could restore
	// the one guests trust, by another writer or by cert-manager past the
	// bound of the controller's hold; it is left as it is.
	ReasonCARescueAbandoned = "CARescueAbandoned"
	// ReasonCASecretNotKept (Warning): Secret <bsls>-ca was deleted
	// without guestbackup.io/replace-ca, but holds no CA guests trust (not
	// a matching certificate and key, no pin yet, or another CA than
	// status.tlsFingerprint): its deletion is let through without a copy.
	ReasonCASecretNotKept = "CASecretNotKept"
	// ReasonServingCertificateIssued (Normal): the controller issued the
	// server's certificate from the BSLS's own CA.
	ReasonServingCertificateIssued = "ServingCertificateIssued"
	// ReasonSharedAcrossNamespaces (Warning): the BSLS started serving VMs
	// of more than one namespace, which share the repository's
	// deduplication (docs/design.md, decision 14).
	ReasonSharedAcrossNamespaces = "SharedAcrossNamespaces"
)

// Reasons of the Events the controller records on the VMs whose snapshots
// reference data the storage lost (status.integrity.damaged), once per
// change: edge-triggered against the status the previous pass wrote.
const (
	// ReasonBackupDamaged (Warning): snapshots of one of the VM's paths
	// newly reference lost data, or more of them do: the message says
	// which, how many files miss data, what still restores and how they
	// heal.
	ReasonBackupDamaged = "BackupDamaged"
	// ReasonBackupHealed (Normal): no snapshot of a path that was damaged
	// references lost data any more: its guest uploaded the data again,
	// or the damaged snapshots expired.
	ReasonBackupHealed = "BackupHealed"
	// ReasonBackupSettled (Warning): damaged snapshots of one of the VM's
	// paths could no longer heal and the server pod rewrote them, each
	// lost file replaced by a stub: those files are lost from them for
	// good, every other file restores, under new snapshot IDs.
	ReasonBackupSettled = "BackupSettled"
	// ReasonBackupQuotaExceeded (Warning): the VM stores more than its
	// quota (spec.quota): its guest's writes are refused, so its
	// snapshots fail, until it stores less or its quota is raised. Its
	// snapshots still list, restore and delete.
	ReasonBackupQuotaExceeded = "BackupQuotaExceeded"
	// ReasonBackupQuotaRestored (Normal): a VM that was over its quota
	// is under it again, or its quota was lifted: its guest backs up
	// again with no action in the guest.
	ReasonBackupQuotaRestored = "BackupQuotaRestored"
)

// Reasons of the Events the controller records on VMs about restore grants
// (annotation guestbackup.io/restore-from), on the grantee and on the VM
// whose snapshots it reads, when that VM exists.
const (
	// ReasonRestoreAccessGranted (Normal): the grant is written for the
	// server, which applies it at once: the grantee's guest may read the
	// other VM's snapshots, read-only.
	ReasonRestoreAccessGranted = "RestoreAccessGranted"
	// ReasonRestoreAccessRevoked (Normal): the grant is removed (the
	// annotation removed or changed, the grantee opted out or deleted).
	ReasonRestoreAccessRevoked = "RestoreAccessRevoked"
	// ReasonRestoreAccessRefused (Warning): the annotation names no VM of
	// the grantee's namespace (another namespace, itself, or no valid
	// name): nothing is granted.
	ReasonRestoreAccessRefused = "RestoreAccessRefused"
)

// problem is why a step cannot go on: a condition's reason and a message
// that names the object at fault and the fix.
type problem struct {
	Reason  string
	Message string
}

// observations is what one reconcile of a BSLS found, prepared and
// observed before anything is decided: desire turns them into what the
// pass writes, decide into its conditions.
type observations struct {
	// BSLS is the object as read at the start of the pass: its spec, and
	// the status the previous pass wrote.
	BSLS *v1alpha1.BackupStorageLocationServer
	// Now is the reconciler's clock.
	Now time.Time
	// ControllerNamespace is the reconciler's: every server's
	// NetworkPolicy admits it.
	ControllerNamespace string
	// Requests is whether the GuestSnapshot API is served
	// (Reconciler.Requests).
	Requests bool
	// Workload is what the server's Deployment is rendered from, as far
	// as storage and platform tell it: its TLS checksum comes from
	// Certificate.
	Workload WorkloadInputs
	// RepositoryProblem is why the storage or the repository password is
	// not in place, if it is not.
	RepositoryProblem *problem
	// Certificate is the server's certificate, when CertificateProblem is
	// nil.
	Certificate *certificateResult
	// CertificateProblem is why the certificate is not usable.
	CertificateProblem *problem
	// CAGuardRetry, when not 0, is how soon the CA guard must look again
	// at a CA Secret that is still going (guardCA).
	CAGuardRetry time.Duration
	// Deployment is the server's Deployment; nil when there is none.
	Deployment *appsv1.Deployment
	// Pods are the server's pods.
	Pods []corev1.Pod
	// Users are the users written to the users Secrets.
	Users UserSet
	// Maintenance is what the server pod last published of the
	// repository's maintenance; nil before its first run.
	Maintenance *v1alpha1.MaintenanceStatus
	// Client is the kopia client the server pod serves guests, as it
	// published it, with the URL guests reach it at; nil before.
	Client *v1alpha1.ClientStatus
	// Storage is what each server pod last published of the repository's
	// storage, by pod name (pods that are gone included, until stale).
	Storage map[string]maintenancestate.StorageState
	// Integrity is what the server pod that runs maintenance last
	// published of its verification of the repository; nil before it did,
	// or when IntegrityUnreadable is set.
	Integrity *maintenancestate.IntegrityState
	// IntegrityUnreadable is why what the pod published of its
	// verification cannot be read; empty when it can.
	IntegrityUnreadable string
}

// decision is what decide makes of one pass's observations.
type decision struct {
	// Conditions are every condition of the BSLS, in the order a new BSLS
	// first gets them.
	Conditions []metav1.Condition
	// RepositoryOpened is true when a server pod has the repository open.
	RepositoryOpened bool
	// RequeueAfter is when to look again without an event.
	RequeueAfter time.Duration
	// Integrity is status.integrity.
	Integrity *v1alpha1.IntegrityStatus
	// Quota is status.quota.
	Quota *v1alpha1.QuotaStatus
	// VMNotices are the Events to record on the VMs whose snapshots became
	// damaged, more damaged or healed since the previous pass's status.
	VMNotices []vmNotice
}

// decide is the condition policy of the BSLS reconciler, the part of
// desire that judges: from what a pass found, it decides every condition,
// its reason and its message, the VMs' notices, and when to look again.
// It reads nothing but obs.
func decide(obs observations) decision {
	b := obs.BSLS
	d := decision{RequeueAfter: RecheckSecrets}
	retry := func(after time.Duration) { d.RequeueAfter = min(d.RequeueAfter, after) }
	cond := func(t string, s metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: b.Generation}
	}
	fromProblem := func(t string, p *problem) metav1.Condition {
		return cond(t, metav1.ConditionFalse, p.Reason, p.Message)
	}

	// CertificateReady.
	var certificate metav1.Condition
	if p := obs.CertificateProblem; p != nil {
		certificate = fromProblem(v1alpha1.ConditionCertificateReady, p)
		retry(retryProblem)
	} else {
		certificate = cond(v1alpha1.ConditionCertificateReady, metav1.ConditionTrue, ReasonCertificateIssued,
			fmt.Sprintf("Secret %s holds the server's certificate for %s from %s; guests trust its CA only", TLSSecretName(b), EndpointHost(b), obs.Certificate.source))
		if renewAt := obs.Certificate.renewAt; !renewAt.IsZero() {
			retry(max(renewAt.Sub(obs.Now), time.Second))
		}
	}

	if obs.CAGuardRetry > 0 {
		retry(obs.CAGuardRetry)
	}

	// RepositoryReady: a problem with storage or password comes first,
	// then what the server pods say.
	server := observeServer(b, obs.Deployment, obs.Pods)
	previous := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionRepositoryReady)
	var repository metav1.Condition
	switch {
	case obs.RepositoryProblem != nil:
		repository = fromProblem(v1alpha1.ConditionRepositoryReady, obs.RepositoryProblem)
		retry(retryProblem)
	case server.initFailure != nil:
		repository = fromProblem(v1alpha1.ConditionRepositoryReady, withPasswordHint(b, server.initFailure))
	case server.available:
		d.RepositoryOpened = true
		repository = cond(v1alpha1.ConditionRepositoryReady, metav1.ConditionTrue, ReasonRepositoryOpened, "The server opened the repository on "+storageDescription(b))
	case previous != nil && previous.Status == metav1.ConditionTrue:
		// Opened before; a restarting pod does not make it unready.
		repository = *previous
	default:
		repository = cond(v1alpha1.ConditionRepositoryReady, metav1.ConditionUnknown, ReasonStorageResolved,
			"Storage and password are in place on "+storageDescription(b)+"; waiting for the server pod to open the repository")
	}

	// ServerAvailable: a server that runs is reported as it is, even while
	// a problem keeps its Deployment from being updated.
	available := cond(v1alpha1.ConditionServerAvailable, server.status, server.reason, server.message)
	if (obs.RepositoryProblem != nil || obs.CertificateProblem != nil) && !server.available {
		available = cond(v1alpha1.ConditionServerAvailable, metav1.ConditionFalse, ReasonWaitingForPrerequisites,
			"The server starts once RepositoryReady and CertificateReady have no problem left")
	}

	// UsersSynced.
	users := obs.Users
	var synced metav1.Condition
	switch {
	case len(users.Pending) > 0:
		if users.RecheckAfter > 0 {
			retry(users.RecheckAfter)
		}
		synced = cond(v1alpha1.ConditionUsersSynced, metav1.ConditionFalse, ReasonHashPending,
			fmt.Sprintf("%d users written; %d wait for their password to be hashed, or their VirtualMachine to be stored or to adopt them: %s", users.Count, len(users.Pending), abbreviate(users.Pending)))
	case !server.available:
		synced = cond(v1alpha1.ConditionUsersSynced, metav1.ConditionFalse, ReasonWaitingForServer,
			fmt.Sprintf("%d users written to the users Secrets; no server pod has applied them yet", users.Count))
	case len(usersNotApplied(obs.Now, obs.Storage)) > 0:
		synced = cond(v1alpha1.ConditionUsersSynced, metav1.ConditionFalse, ReasonUsersNotApplied,
			fmt.Sprintf("%d users written to the users Secrets, but the repository did not take them (%s): users added since cannot log in until it does; "+
				"removed users and changed passwords are refused meanwhile by the session gate. Check StorageSpace and StorageAvailable",
				users.Count, strings.Join(usersNotApplied(obs.Now, obs.Storage), "; ")))
	default:
		msg := fmt.Sprintf("%d users written; the server applies them by diff at once", users.Count)
		if len(users.Refused) > 0 {
			msg += fmt.Sprintf("; %d credential Secrets refused (see Events)", len(users.Refused))
		}
		if namespaces := ServedNamespaces(users); len(namespaces) > 1 {
			msg += "; " + sharedMessage(namespaces)
		}
		synced = cond(v1alpha1.ConditionUsersSynced, metav1.ConditionTrue, ReasonUsersSynced, msg)
	}

	storage := storageCondition(obs.Now, obs.Storage)
	storage.ObservedGeneration = b.Generation
	for _, st := range obs.Storage {
		// Looked at again when the state of a pod that stopped saying it
		// grows stale.
		if stale := st.CheckedAt.Add(maintenancestate.StorageStale).Sub(obs.Now); stale > 0 {
			retry(stale + time.Second)
		}
	}

	// RepositoryIntact, status.integrity and the Events of the VMs whose
	// snapshots it finds damaged or healed.
	d.Integrity = integrityStatus(obs.Integrity, obs.IntegrityUnreadable, b.Status.Integrity)
	intact := integrityCondition(b, d.Integrity, obs.IntegrityUnreadable != "")
	intact.ObservedGeneration = b.Generation
	d.VMNotices = damageNotices(types.NamespacedName{Namespace: b.Namespace, Name: b.Name}, b.Status.Integrity, d.Integrity)

	// status.quota and the Events of the VMs that went over their quota
	// or back under it.
	d.Quota = quotaStatus(b, obs.Users, obs.Now, obs.Storage)
	d.VMNotices = append(d.VMNotices, quotaNotices(types.NamespacedName{Namespace: b.Namespace, Name: b.Name}, b.Status.Quota, d.Quota)...)

	space := spaceCondition(b, obs.Now, obs.Storage)
	space.ObservedGeneration = b.Generation

	// Ready: every other condition is True; StorageAvailable and
	// RepositoryIntact only must not be False (a server pod of an older
	// guestbackup checks and verifies nothing, and a verification that
	// could not run says nothing about guests connecting), and
	// StorageSpace not StorageFull (low space is a warning: guests still
	// snapshot; storage that cannot tell its space is no fault).
	d.Conditions = []metav1.Condition{certificate, repository, available, synced, storage, space, intact}
	var notReady []string
	for _, c := range d.Conditions {
		if notReadyFor(c) {
			notReady = append(notReady, c.Type)
		}
	}
	ready := cond(v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonReady, "Guests can connect to "+Endpoint(b))
	if len(notReady) > 0 {
		ready = cond(v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNotReady, "Not True: "+strings.Join(notReady, ", "))
	}
	d.Conditions = append(d.Conditions, ready)
	return d
}

// usersNotApplied names each server pod whose last user sync, as its
// fresh storage state says, could not apply the users to the repository,
// with why, sorted.
func usersNotApplied(now time.Time, states map[string]maintenancestate.StorageState) []string {
	var out []string
	for pod, st := range states {
		if st.UsersNotApplied != "" && now.Sub(st.CheckedAt) <= maintenancestate.StorageStale {
			out = append(out, "server pod "+pod+": "+st.UsersNotApplied)
		}
	}
	slices.Sort(out)
	return out
}

// storageCondition is StorageAvailable from what the server pods last
// found of the storage, as of now: False while any of them could not
// reach it, naming each with the storage's own error and since when. A
// state not published again for maintenancestate.StorageStale is of a pod
// that is gone (or cannot write), and no longer counts.
func storageCondition(now time.Time, states map[string]maintenancestate.StorageState) metav1.Condition {
	cond := func(s metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.ConditionStorageAvailable, Status: s, Reason: reason, Message: msg}
	}
	var failing []string
	fresh := 0
	for pod, st := range states {
		if now.Sub(st.CheckedAt) > maintenancestate.StorageStale {
			continue
		}
		fresh++
		if !st.Available {
			failing = append(failing, fmt.Sprintf("server pod %s since %s: %s", pod, st.Since.UTC().Format(time.RFC3339), st.Error))
		}
	}
	slices.Sort(failing)
	switch {
	case len(failing) > 0:
		return cond(metav1.ConditionFalse, ReasonStorageUnavailable,
			"The repository's storage does not answer ("+strings.Join(failing, "; ")+"): guests' snapshots fail until it does; check the storage and the server pods' network to it")
	case fresh == 0:
		return cond(metav1.ConditionUnknown, ReasonStorageNotChecked, "No server pod has checked the repository's storage lately")
	}
	pods := "server pods"
	if fresh == 1 {
		pods = "server pod"
	}
	return cond(metav1.ConditionTrue, ReasonStorageReachable,
		fmt.Sprintf("%d %s checked the repository's storage within %s and reached it", fresh, pods, maintenancestate.StorageStale))
}

// notReadyFor reports whether condition c keeps the BSLS from Ready.
func notReadyFor(c metav1.Condition) bool {
	switch c.Type {
	case v1alpha1.ConditionStorageAvailable, v1alpha1.ConditionRepositoryIntact:
		return c.Status == metav1.ConditionFalse
	case v1alpha1.ConditionStorageSpace:
		return c.Status == metav1.ConditionFalse && c.Reason == ReasonStorageFull
	}
	return c.Status != metav1.ConditionTrue
}

// LowSpacePercent is the share of its capacity below which the free space
// of a repository's volume is low (StorageSpace LowSpace): the kubelet's
// default for a node's filesystem (nodefs.available<10%), a margin that
// leaves a day of guests' growth on most volumes to grow the claim in.
const LowSpacePercent = 10

// A volume with less free than fullBelow is full (StorageSpace
// StorageFull): Kopia writes data in packs of up to FullBelowBytes (its
// default maximum pack size) and removes a pack it could not finish, so a
// volume a guest filled is left with less than a pack free, rarely with
// none. On a small volume, FullBelowPercent of its capacity counts
// instead, so that LowSpace still warns first.
const (
	FullBelowBytes   = 20 << 20
	FullBelowPercent = 5
)

// fullBelow is the free space under which a volume of capacity bytes is
// full.
func fullBelow(capacity uint64) uint64 {
	return min(FullBelowBytes, capacity*FullBelowPercent/100)
}

// spaceCondition is StorageSpace from what the server pods last found of
// the storage, as of now: StorageFull when any refused write for want of
// space is reported or the volume has no byte free, LowSpace below
// LowSpacePercent free, Sufficient above, NotMeasured when no pod measured
// it. The server pods share the storage; the lowest free space any of
// them measured counts. A state older than maintenancestate.StorageStale
// does not count.
func spaceCondition(b *v1alpha1.BackupStorageLocationServer, now time.Time, states map[string]maintenancestate.StorageState) metav1.Condition {
	cond := func(s metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.ConditionStorageSpace, Status: s, Reason: reason, Message: msg}
	}
	var refused []string
	var lowest *maintenancestate.StorageSpace
	lowestPod := ""
	for _, pod := range slices.Sorted(maps.Keys(states)) {
		st := states[pod]
		if now.Sub(st.CheckedAt) > maintenancestate.StorageStale {
			continue
		}
		if st.Refused != "" {
			refused = append(refused, fmt.Sprintf("server pod %s since %s: %s", pod, st.RefusedAt.UTC().Format(time.RFC3339), st.Refused))
		}
		if st.Space != nil && (lowest == nil || st.Space.FreeBytes < lowest.FreeBytes) {
			lowest, lowestPod = st.Space, pod
		}
	}
	measured := ""
	if lowest != nil {
		measured = fmt.Sprintf("%s free of %s (%d%%), as server pod %s measured", units.Bytes(lowest.FreeBytes), units.Bytes(lowest.CapacityBytes),
			lowest.FreeBytes*100/lowest.CapacityBytes, lowestPod)
	}
	where := storageDescription(b)
	switch {
	case len(refused) > 0:
		msg := "The repository's storage (" + where + ") refused writes for want of space (" + strings.Join(refused, "; ") + ")"
		if measured != "" {
			msg += "; it has " + measured
		}
		return cond(metav1.ConditionFalse, ReasonStorageFull, msg+": "+fullAdvice(b))
	case lowest != nil && lowest.FreeBytes < fullBelow(lowest.CapacityBytes):
		return cond(metav1.ConditionFalse, ReasonStorageFull, "The repository's volume ("+where+") is full, "+measured+
			fmt.Sprintf(", less than Kopia's next pack may need (%s): %s", units.Bytes(fullBelow(lowest.CapacityBytes)), fullAdvice(b)))
	case lowest != nil && lowest.FreeBytes*100 < lowest.CapacityBytes*LowSpacePercent:
		return cond(metav1.ConditionFalse, ReasonLowSpace, fmt.Sprintf("The repository's volume (%s) has %s, below %d%%: guests' snapshots fail once it is full. %s",
			where, measured, LowSpacePercent, roomAdvice(b)))
	case lowest != nil:
		return cond(metav1.ConditionTrue, ReasonSufficient, fmt.Sprintf("The repository's volume (%s) has %s; below %d%% this condition warns", where, measured, LowSpacePercent))
	}
	return cond(metav1.ConditionUnknown, ReasonNotMeasured, "No server pod measured the free space of the repository's storage ("+where+
		") lately: an S3 bucket cannot tell it (a write it refuses for want of space, such as over a quota, turns this condition False), nor can a server pod of an older guestbackup")
}

// fullAdvice is what to do about a full storage.
func fullAdvice(b *v1alpha1.BackupStorageLocationServer) string {
	return "guests' snapshots fail, and listing them may too, until there is space; they snapshot again by themselves once there is. " + roomAdvice(b) +
		" Make room first: Kopia's maintenance, which frees the data of expired snapshots, needs space to write too"
}

// roomAdvice says how to make room on b's storage.
func roomAdvice(b *v1alpha1.BackupStorageLocationServer) string {
	lower := "lower retention (spec.repository.defaultPolicy), whose expired snapshots' data Kopia's full maintenance frees after its safety margin"
	if b.Spec.Storage.Filesystem != nil {
		return "Grow PersistentVolumeClaim " + b.Namespace + "/" + ClaimName(b) + " (its StorageClass must allow volume expansion), remove what else fills the volume, or " + lower + "."
	}
	return "Raise the bucket's quota or free space on its storage, or " + lower + "."
}

// serverState is what the server's Deployment and pods say.
type serverState struct {
	available bool
	status    metav1.ConditionStatus
	reason    string
	message   string
	// initFailure is set when a pod's init container (which opens the
	// repository) failed: that is the repository's problem.
	initFailure *problem
}

// observeServer reads the server's state from its Deployment (nil when
// there is none) and its pods.
func observeServer(b *v1alpha1.BackupStorageLocationServer, d *appsv1.Deployment, pods []corev1.Pod) serverState {
	if d == nil {
		d = &appsv1.Deployment{}
	}
	if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
		return serverState{status: metav1.ConditionFalse, reason: ReasonScaledToZero, message: "spec.replicas is 0: no server runs; the repository is untouched"}
	}
	st := serverState{status: metav1.ConditionFalse, reason: ReasonServerStarting, message: fmt.Sprintf("Deployment %s has no available server pod yet", DeploymentName(b))}
	if d.Status.AvailableReplicas > 0 {
		st = serverState{available: true, status: metav1.ConditionTrue, reason: ReasonServerAvailable,
			message: fmt.Sprintf("%d of %d server pods available", d.Status.AvailableReplicas, d.Status.Replicas)}
	}
	pods = slices.SortedFunc(slices.Values(pods), func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, pod := range pods {
		for _, cs := range pod.Status.InitContainerStatuses {
			if t := failedTermination(cs); t != nil {
				st.initFailure = &problem{ReasonRepositoryInitFailed, fmt.Sprintf("pod %s: the init container, which opens the repository, exited with code %d: %s", pod.Name, t.ExitCode, strings.TrimSpace(t.Message))}
			}
		}
		if st.available {
			continue
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
				st.message = fmt.Sprintf("pod %s, container %s: %s %s", pod.Name, cs.Name, w.Reason, w.Message)
			}
		}
	}
	return st
}

// failedTermination is a container's latest failed exit, if any.
func failedTermination(cs corev1.ContainerStatus) *corev1.ContainerStateTerminated {
	if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
		return t
	}
	if cs.State.Terminated == nil && cs.State.Running == nil {
		if t := cs.LastTerminationState.Terminated; t != nil && t.ExitCode != 0 {
			return t
		}
	}
	return nil
}

// storageDescription names where the repository lives, without secrets.
func storageDescription(b *v1alpha1.BackupStorageLocationServer) string {
	st := b.Spec.Storage
	switch {
	case st.Filesystem != nil:
		return "PersistentVolumeClaim " + ClaimName(b)
	case st.S3 != nil:
		return fmt.Sprintf("s3://%s/%s", st.S3.Bucket, st.S3.Prefix)
	case st.BackupStorageLocation != nil:
		return fmt.Sprintf("Velero BackupStorageLocation %s/%s", st.BackupStorageLocation.Namespace, st.BackupStorageLocation.Name)
	}
	return "no storage"
}

// abbreviate lists at most three names.
func abbreviate(names []string) string {
	if len(names) <= 3 {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:3], ", ") + fmt.Sprintf(" and %d more", len(names)-3)
}
