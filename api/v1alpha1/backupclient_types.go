package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons of a BackupClient's Ready condition.
const (
	// BackupClientReasonProvisioned (True): the client's user is on its
	// server with the password its Secret holds.
	BackupClientReasonProvisioned = "Provisioned"
	// BackupClientReasonProvisioning (False): the credentials are issued
	// and the server's users Secrets do not hold them yet.
	BackupClientReasonProvisioning = "Provisioning"
	// BackupClientReasonServerNotFound (False): spec.server names no
	// BackupStorageLocationServer.
	BackupClientReasonServerNotFound = "ServerNotFound"
	// BackupClientReasonServerNotReady (False): the server has no endpoint
	// or CA yet, which the Secret must carry.
	BackupClientReasonServerNotReady = "ServerNotReady"
	// BackupClientReasonNamespaceNotAdmitted (False): the server's
	// spec.access.namespaceSelector does not select the client's
	// namespace; no credentials are issued and none are kept.
	BackupClientReasonNamespaceNotAdmitted = "NamespaceNotAdmitted"
	// BackupClientReasonSecretConflict (False): a Secret of the name the
	// credentials go to exists and is not this client's.
	BackupClientReasonSecretConflict = "SecretConflict"
	// BackupClientReasonPasswordHashNotAllowed (False): spec.passwordHash
	// is set on a client outside its server's namespace. Only the server's
	// admin declares a client with a password of their own (a host outside
	// the cluster); no user is provisioned and no credentials are kept.
	BackupClientReasonPasswordHashNotAllowed = "PasswordHashNotAllowed"
	// BackupClientReasonPasswordHashInvalid (False): the Secret
	// spec.passwordHash names does not exist, or its key holds no hash
	// that `kopia server user hash-password` printed.
	BackupClientReasonPasswordHashInvalid = "PasswordHashInvalid"
)

// PasswordHashSource is where the admin keeps the hash of a password of
// their own: a Secret of the BackupClient's namespace.
type PasswordHashSource struct {
	// SecretName is the Secret, in the client's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName"`
	// Key holds the hash, as `kopia server user hash-password` prints it;
	// default passwordHash.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	Key string `json:"key,omitempty"`
}

// ServerReference names a BackupStorageLocationServer.
type ServerReference struct {
	// Namespace is the BSLS's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// Name is the BSLS's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// String is <namespace>/<name>, as the VM annotation guestbackup.io/server
// names a server.
func (r ServerReference) String() string { return r.Namespace + "/" + r.Name }

// BackupClientSpec is what a workload asks for.
type BackupClientSpec struct {
	// Server is the BackupStorageLocationServer the client backs up to. Its
	// spec.access.namespaceSelector must select the client's namespace,
	// unless the client is in the server's own namespace. It
	// cannot change: a client that moves to another server is deleted
	// (which revokes its user) and created again.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="server is immutable: delete the BackupClient (its user is revoked) and create it again naming the new server"
	Server ServerReference `json:"server"`

	// SecretName is the Secret of the client's namespace the controller
	// writes the credentials into, for the workload's pods to mount;
	// default <name>-backupclient. It cannot change.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="secretName is immutable"
	// +optional
	SecretName string `json:"secretName,omitempty"`

	// Rotate issues new credentials whenever its value changes; the
	// previous password stops authenticating as soon as the server holds
	// the new one (restart the workload's pods that read it from their
	// environment). With passwordHash, the admin rotates by writing a new
	// hash instead.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Rotate string `json:"rotate,omitempty"`

	// PasswordHash declares a client whose password only its admin knows,
	// such as a host outside the cluster: the server holds the hash that
	// Secret holds, no password enters the cluster, and the client's
	// Secret carries everything else (URL, CA, user, connect line). Only
	// in the server's own namespace, whose admin is the server's: anywhere
	// else the client gets no user (PasswordHashNotAllowed). A new hash in
	// the Secret is a rotation, seen within a minute.
	// +optional
	PasswordHash *PasswordHashSource `json:"passwordHash,omitempty"`
}

// BackupClientStatus is what the controller issued, and whether it works.
type BackupClientStatus struct {
	// Identity is the client's Kopia user (user@host), derived from its
	// name and namespace: <name>@<namespace>.client. Its snapshots carry it.
	// +optional
	Identity string `json:"identity,omitempty"`
	// SecretName is the Secret that holds the credentials, once issued.
	// +optional
	SecretName string `json:"secretName,omitempty"`
	// CredentialsGeneration counts the credentials issued (1, then one more
	// per rotation); the Secret's key generation says the same.
	// +optional
	CredentialsGeneration int64 `json:"credentialsGeneration,omitempty"`
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Snapshots is how many snapshots the repository holds under the
	// client's identity, as its server last published them.
	// +optional
	Snapshots int32 `json:"snapshots,omitempty"`
	// LastSnapshot is the newest of them (a SnapshotCreated Event
	// announces each new one).
	// +optional
	LastSnapshot *GuestSnapshotSummary `json:"lastSnapshot,omitempty"`
	// Conditions: Ready, with the reasons BackupClientReason*.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BackupClient opts a workload of the namespace (a CronJob that dumps a
// database, a sidecar, any kopia client) in to a BackupStorageLocationServer,
// by the same rules as a VirtualMachine: an identity of its own, derived
// from its name and namespace and never equal to a VM's; explicit ACLs
// (its own snapshots only); append-only when the server is; rotation;
// revocation when it goes. The controller writes its credentials into a
// Secret of the namespace, owned by it, which a pod mounts (docs/clients.md).
// In the server's own namespace, its admin declares hosts outside the
// cluster the same way, with a generated password to hand over or the hash
// of one of their own (spec.passwordHash).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bclient,categories=guestbackup
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Identity",type=string,JSONPath=`.status.identity`
// +kubebuilder:printcolumn:name="Last Snapshot",type=date,JSONPath=`.status.lastSnapshot.endTime`
// +kubebuilder:printcolumn:name="Secret",type=string,JSONPath=`.status.secretName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BackupClient struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec BackupClientSpec `json:"spec"`
	// +optional
	Status BackupClientStatus `json:"status,omitempty"`
}

// BackupClientList is a list of BackupClients.
// +kubebuilder:object:root=true
type BackupClientList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackupClient `json:"items"`
}

func init() {
	SchemeBuilder.Register(&BackupClient{}, &BackupClientList{})
}
