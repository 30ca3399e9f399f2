package backupclient

import (
	"fmt"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// Reasons of the Events on a BackupClient besides its Ready reasons, which
// are recorded as Events too when Ready changes to them.
const (
	// ReasonCredentialsIssued: the first credentials were written.
	ReasonCredentialsIssued = "CredentialsIssued"
	// ReasonCredentialsRotated: new credentials replaced the previous ones.
	ReasonCredentialsRotated = "CredentialsRotated"
	// ReasonCredentialsWithdrawn: the Secret was deleted because the client
	// may no longer use its server.
	ReasonCredentialsWithdrawn = "CredentialsWithdrawn"
	// ReasonUserProvisioned: the server holds the client's current password.
	ReasonUserProvisioned = "UserProvisioned"
)

// inputs is everything decide decides from.
type inputs struct {
	// Client is the BackupClient, as read.
	Client *v1alpha1.BackupClient
	// Server is the BSLS its spec names; nil when there is none.
	Server *v1alpha1.BackupStorageLocationServer
	// Admitted is whether Server's namespaceSelector selects the client's
	// namespace.
	Admitted bool
	// Secret is the Secret at the client's Secret name; nil when none.
	Secret *corev1.Secret
	// Provisioned is the hash the server's users Secret holds for the
	// client's identity; nil when it holds none.
	Provisioned *identity.Hash
	// OwnHash is, for a client with spec.passwordHash in its server's
	// namespace, the hash its admin's Secret holds; HashProblem says why
	// there is none ("" when there is).
	OwnHash     *identity.Hash
	HashProblem string
	// Activity is what the server last published of the client's
	// snapshots; nil when it published none.
	Activity *activity.Guest
	// Now is when a condition that changes now changed.
	Now metav1.Time
}

// secretAction is what to do with the client's Secret.
type secretAction int

const (
	// secretKeep: leave it as it is (or absent).
	secretKeep secretAction = iota
	// secretIssue: write it with new credentials (generation + 1).
	secretIssue
	// secretRefresh: write it with the same credentials and the server's
	// current URL and CA.
	secretRefresh
	// secretDelete: delete it, the client's own.
	secretDelete
)

func (a secretAction) String() string {
	return [...]string{"keep", "issue", "refresh", "delete"}[a]
}

// plan is decide's answer: the Secret's fate, the status, and the Events.
type plan struct {
	Secret secretAction
	// Generation is the generation secretIssue writes.
	Generation int64
	// Status is the whole status to write.
	Status v1alpha1.BackupClientStatus
	// Events are recorded on the client, in order.
	Events []event
}

// event is one Event on the client.
type event struct{ Type, Reason, Message string }

// decide is the whole policy of the reconciler: a pure function of what it
// read. Its credentials (decideCredentials), then what its server published
// of its snapshots (observe).
func decide(in inputs) plan {
	p := decideCredentials(in)
	observe(&p, in)
	return p
}

// observe records in p what the server published of the client's
// snapshots: their count, the newest, and an Event for a new newest. What
// it no longer publishes (its server gone, say) keeps its last value, as
// the age of the last snapshot is what an admin watches.
func observe(p *plan, in inputs) {
	p.Status.Snapshots, p.Status.LastSnapshot = in.Client.Status.Snapshots, in.Client.Status.LastSnapshot
	g := in.Activity
	if g == nil {
		return
	}
	p.Status.Snapshots = int32(min(g.Snapshots, math.MaxInt32)) //nolint:gosec // bounded above
	if g.Last.ID == "" || p.Status.LastSnapshot != nil && p.Status.LastSnapshot.ID == g.Last.ID {
		return
	}
	// In a VM's words: the audit's SnapshotCreated.
	last := audit.Summary(g.Last)
	p.Status.LastSnapshot = &last
	p.Events = append(p.Events, event{corev1.EventTypeNormal, audit.ReasonSnapshotCreated, audit.SnapshotCreatedMessage(g)})
}

// decideCredentials decides the client's credentials and Ready.
// Credentials exist only while the client's namespace may use an existing
// server; the Secret is never written over when another object owns it; a
// new spec.rotate issues a new generation; the client is Ready once the
// server holds the hash of its current password.
func decideCredentials(in inputs) plan {
	c := in.Client
	server := c.Spec.Server.String()
	own := in.Secret != nil && clientsecret.IsOf(in.Secret, c)
	p := plan{Status: v1alpha1.BackupClientStatus{
		Identity:           identity.OfClient(c.Name, c.Namespace),
		ObservedGeneration: c.Generation,
		Conditions:         append([]metav1.Condition(nil), c.Status.Conditions...),
	}}
	if own {
		p.Status.SecretName = in.Secret.Name
		p.Status.CredentialsGeneration = clientsecret.Generation(in.Secret)
	}
	ready := func(status metav1.ConditionStatus, reason, message string) plan {
		p.Events = append(p.Events, transition(c.Status.Conditions, status, reason, message)...)
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionReady, Status: status, Reason: reason, Message: message, ObservedGeneration: c.Generation,
			LastTransitionTime: in.Now,
		})
		return p
	}
	withdraw := func(why string) {
		if own {
			p.Secret = secretDelete
			p.Status.SecretName, p.Status.CredentialsGeneration = "", 0
			p.Events = append(p.Events, event{corev1.EventTypeNormal, ReasonCredentialsWithdrawn,
				fmt.Sprintf("Deleted Secret %s (credentials generation %d): %s", in.Secret.Name, clientsecret.Generation(in.Secret), why)})
		}
	}

	switch {
	case in.Server == nil:
		why := fmt.Sprintf("BackupStorageLocationServer %s does not exist", server)
		withdraw(why)
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonServerNotFound, why+"; no credentials are issued for it")
	case !in.Admitted:
		why := fmt.Sprintf("BackupStorageLocationServer %s does not admit namespace %s (its spec.access.namespaceSelector)", server, c.Namespace)
		withdraw(why)
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonNamespaceNotAdmitted, why+"; no user is provisioned and no credentials are issued: ask the server's admin to admit the namespace")
	case c.Spec.PasswordHash != nil && c.Namespace != in.Server.Namespace:
		why := fmt.Sprintf("spec.passwordHash declares a client whose password only its admin knows, which only the admin of BackupStorageLocationServer %s does, in its namespace %s", server, in.Server.Namespace)
		withdraw(why)
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonPasswordHashNotAllowed, why+"; no user is provisioned: remove spec.passwordHash to have credentials issued, or ask the server's admin to declare the client")
	case c.Spec.PasswordHash != nil && in.HashProblem != "" && own && clientsecret.Hash(in.Secret) != nil:
		// A Secret replaced, or a new hash mistyped, revokes no working
		// host: it keeps the hash it has until a valid one comes.
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonPasswordHashInvalid,
			fmt.Sprintf("%s; the server keeps the hash of credentials generation %d until it does (delete the BackupClient to revoke the host)", in.HashProblem, clientsecret.Generation(in.Secret)))
	case c.Spec.PasswordHash != nil && in.HashProblem != "":
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonPasswordHashInvalid, in.HashProblem+"; no user is provisioned until it does")
	case in.Secret != nil && !own:
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonSecretConflict,
			fmt.Sprintf("Secret %s exists and is not this BackupClient's (%s): it is left as it is; name another in spec.secretName, or delete it", in.Secret.Name, owner(in.Secret)))
	case in.Server.Status.Endpoint == "" || in.Server.Status.TLSCA == "":
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonServerNotReady,
			fmt.Sprintf("BackupStorageLocationServer %s has no endpoint or CA yet; the credentials are issued once it has", server))
	}

	current := clientsecret.Server{URL: in.Server.Status.Endpoint, CA: in.Server.Status.TLSCA}
	// Whose password: one the controller generates, or the admin's own.
	ownPassword, whose := c.Spec.PasswordHash != nil, ""
	if ownPassword {
		whose = fmt.Sprintf(", the password hash of Secret %s", c.Spec.PasswordHash.SecretName)
	}
	switch {
	case !own, clientsecret.Generation(in.Secret) == 0, clientsecret.Hash(in.Secret) == nil:
		p.Secret, p.Generation = secretIssue, 1
		if own {
			p.Generation = clientsecret.Generation(in.Secret) + 1
		}
		p.Events = append(p.Events, event{corev1.EventTypeNormal, ReasonCredentialsIssued,
			fmt.Sprintf("Credentials of %s for BackupStorageLocationServer %s (generation %d%s) written to Secret %s", p.Status.Identity, server, p.Generation, whose, clientsecret.Name(c))})
	case ownPassword && !clientsecret.Hash(in.Secret).Equal(*in.OwnHash):
		p.Secret, p.Generation = secretIssue, clientsecret.Generation(in.Secret)+1
		p.Events = append(p.Events, event{corev1.EventTypeNormal, ReasonCredentialsRotated,
			fmt.Sprintf("Credentials of %s rotated from generation %d to %d (the password hash of Secret %s changed); the previous password stops authenticating once the server holds the new one", p.Status.Identity, p.Generation-1, p.Generation, c.Spec.PasswordHash.SecretName)})
	case !ownPassword && len(in.Secret.Data[clientsecret.KeyPassword]) == 0:
		// Its admin's password no longer: one is generated.
		p.Secret, p.Generation = secretIssue, clientsecret.Generation(in.Secret)+1
		p.Events = append(p.Events, event{corev1.EventTypeNormal, ReasonCredentialsRotated,
			fmt.Sprintf("Credentials of %s rotated from generation %d to %d (spec.passwordHash was removed: the password is generated); the previous password stops authenticating once the server holds the new one", p.Status.Identity, p.Generation-1, p.Generation)})
	case !ownPassword && in.Secret.Annotations[clientsecret.AnnotationRotate] != c.Spec.Rotate:
		p.Secret, p.Generation = secretIssue, clientsecret.Generation(in.Secret)+1
		p.Events = append(p.Events, event{corev1.EventTypeNormal, ReasonCredentialsRotated,
			fmt.Sprintf("Credentials of %s rotated from generation %d to %d (spec.rotate changed); the previous password stops authenticating once the server holds the new one", p.Status.Identity, p.Generation-1, p.Generation)})
	case !rendered(in.Secret, c, current):
		p.Secret = secretRefresh
	}
	if p.Secret == secretIssue {
		p.Status.SecretName, p.Status.CredentialsGeneration = clientsecret.Name(c), p.Generation
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonProvisioning,
			fmt.Sprintf("Credentials generation %d issued; waiting for BackupStorageLocationServer %s to hold them", p.Generation, server))
	}
	if h := clientsecret.Hash(in.Secret); in.Provisioned == nil || !in.Provisioned.Equal(*h) {
		return ready(metav1.ConditionFalse, v1alpha1.BackupClientReasonProvisioning,
			fmt.Sprintf("Credentials generation %d issued; waiting for BackupStorageLocationServer %s to hold them", p.Status.CredentialsGeneration, server))
	}
	return ready(metav1.ConditionTrue, v1alpha1.BackupClientReasonProvisioned,
		fmt.Sprintf("User %s is provisioned on BackupStorageLocationServer %s with credentials generation %d (Secret %s)", p.Status.Identity, server, p.Status.CredentialsGeneration, in.Secret.Name))
}

// rendered is whether s says what Render would write for c on server with
// s's own credentials.
func rendered(s *corev1.Secret, c *v1alpha1.BackupClient, server clientsecret.Server) bool {
	want := clientsecret.Render(c, server, clientsecret.CredentialsOf(s))
	for k, v := range want.Data {
		if string(s.Data[k]) != string(v) {
			return false
		}
	}
	return len(s.Data) == len(want.Data)
}

// transition is the Event of Ready becoming reason, when it was not before:
// a provisioning is news, a refusal is a warning, the wait is neither.
func transition(before []metav1.Condition, status metav1.ConditionStatus, reason, message string) []event {
	if c := meta.FindStatusCondition(before, v1alpha1.ConditionReady); c != nil && c.Status == status && c.Reason == reason {
		return nil
	}
	switch reason {
	case v1alpha1.BackupClientReasonProvisioned:
		return []event{{corev1.EventTypeNormal, ReasonUserProvisioned, message}}
	case v1alpha1.BackupClientReasonProvisioning:
		return nil
	}
	return []event{{corev1.EventTypeWarning, reason, message}}
}

// owner says who owns s, for the conflict's message.
func owner(s *corev1.Secret) string {
	if ref := metav1.GetControllerOf(s); ref != nil {
		return fmt.Sprintf("controlled by %s %s", ref.Kind, ref.Name)
	}
	return "no controller"
}
