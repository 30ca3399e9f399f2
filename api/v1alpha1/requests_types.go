package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GuestSnapshot and GuestRestore are requests (docs/design.md, decisions
// 21-24): a VM owner asks, with the namespace's ordinary RBAC, for
// something the VM's guest then carries out under its own Kopia identity.
// A request is one-shot: its spec never changes after creation (a CEL rule
// on spec), and guestbackup's webhook stamps who asked into spec.requester
// at creation, whatever the client sent (docs/requests.md).

// RestoresFolder is the guest folder under which a GuestRestore without
// an explicit target restores, into a subfolder named after the request:
// a restore never overwrites the guest's files by surprise.
const RestoresFolder = "/var/lib/guestbackup/restores"

// RequestPhase is where a request is in its life.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type RequestPhase string

// The phases of a request.
const (
	// PhasePending: admitted, not started by the guest (or Job) yet.
	PhasePending RequestPhase = "Pending"
	// PhaseRunning: started; status reports progress.
	PhaseRunning RequestPhase = "Running"
	// PhaseSucceeded: done; status says what was written.
	PhaseSucceeded RequestPhase = "Succeeded"
	// PhaseFailed: ended without doing all it asked; status.message says why.
	PhaseFailed RequestPhase = "Failed"
)

// Requester is who created a request, as the API server authenticated
// them, copied from the admission request's user info by guestbackup's
// webhook (as cert-manager does for a CertificateRequest). Whatever a
// client sends here is replaced; nobody can change it afterwards.
type Requester struct {
	// Username is the requester's user name.
	// +optional
	Username string `json:"username,omitempty"`

	// UID is the requester's user UID, when their authenticator gives one.
	// +optional
	UID string `json:"uid,omitempty"`

	// Groups are the requester's groups.
	// +listType=atomic
	// +optional
	Groups []string `json:"groups,omitempty"`

	// Extra is the additional information their authenticator gave.
	// +optional
	Extra map[string][]string `json:"extra,omitempty"`
}

// GuestSnapshotSpec is "back this VM up now". Immutable.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a GuestSnapshot's spec cannot change: a request is one-shot; create a new GuestSnapshot instead"
type GuestSnapshotSpec struct {
	// VM is the name of the VirtualMachine, in this request's namespace,
	// whose guest takes the snapshot. It must exist and be opted in
	// (annotation guestbackup.io/server).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	VM string `json:"vm"`

	// Paths are the absolute guest paths to snapshot, each its own Kopia
	// snapshot source. Empty: the VM's annotation guestbackup.io/paths.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +listType=atomic
	// +optional
	Paths []string `json:"paths,omitempty"`

	// Tags are Kopia tags added to each snapshot taken (key: value).
	// +kubebuilder:validation:MaxProperties=16
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$') && size(self[k]) <= 256)",message="a tag's key is 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit, and its value at most 256 characters"
	// +optional
	Tags map[string]string `json:"tags,omitempty"`

	// Description is the snapshots' Kopia description.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Description string `json:"description,omitempty"`

	// Requester is who created this request: written by guestbackup's
	// webhook at creation, never by a client.
	// +optional
	Requester *Requester `json:"requester,omitempty"`
}

// PathSnapshot is the snapshot taken of one path.
type PathSnapshot struct {
	// Path is the guest path snapshotted (of a GuestRestore: restored).
	Path string `json:"path"`
	// ID is the Kopia snapshot (manifest) ID.
	ID string `json:"id"`
}

// GuestSnapshotStatus is what became of a GuestSnapshot.
type GuestSnapshotStatus struct {
	// Phase is Pending, Running, Succeeded or Failed; empty until the
	// request is picked up.
	// +optional
	Phase RequestPhase `json:"phase,omitempty"`

	// Conditions are the request's conditions.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Snapshots are the snapshots taken, one per path.
	// +listType=atomic
	// +optional
	Snapshots []PathSnapshot `json:"snapshots,omitempty"`

	// Files is the number of files the snapshots hold.
	// +optional
	Files int64 `json:"files,omitempty"`

	// Bytes is the size of the files the snapshots hold.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`

	// StartTime is when the guest started the request.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// CompletionTime is when it ended, whatever the outcome.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// Message says what happened, and on failure what to do about it.
	// +optional
	Message string `json:"message,omitempty"`
}

// GuestSnapshot asks a VM's guest to snapshot now, under its own identity.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=guestbackup
// +kubebuilder:printcolumn:name="VM",type=string,JSONPath=`.spec.vm`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.status.snapshots[0].id`
// +kubebuilder:printcolumn:name="Requester",type=string,JSONPath=`.spec.requester.username`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GuestSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GuestSnapshotSpec   `json:"spec"`
	Status GuestSnapshotStatus `json:"status,omitempty"`
}

// GuestSnapshotList is a list of GuestSnapshots.
// +kubebuilder:object:root=true
type GuestSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuestSnapshot `json:"items"`
}

// SnapshotSelector chooses the snapshot a GuestRestore restores from: by
// ID, or the last one before a time; neither means the latest.
// +kubebuilder:validation:XValidation:rule="!(has(self.id) && has(self.before))",message="choose the snapshot by snapshot.id or by snapshot.before, not both; set neither for the latest"
type SnapshotSelector struct {
	// ID is a Kopia snapshot (manifest) ID of the source VM.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ID string `json:"id,omitempty"`

	// Before chooses the last snapshot taken before this time (RFC 3339).
	// +optional
	Before *metav1.Time `json:"before,omitempty"`
}

// RestoreTarget is where a GuestRestore writes. At most one field is set;
// none means a fresh folder in the running guest,
// /var/lib/guestbackup/restores/<request name>.
// +kubebuilder:validation:XValidation:rule="(has(self.directory) ? 1 : 0) + (has(self.inPlace) && self.inPlace ? 1 : 0) + (has(self.persistentVolumeClaim) ? 1 : 0) <= 1",message="set at most one of target.directory, target.inPlace and target.persistentVolumeClaim; none restores into /var/lib/guestbackup/restores/<request name> in the guest"
type RestoreTarget struct {
	// Directory is an absolute folder in the running guest that the
	// paths are restored under, each at its full path.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Directory string `json:"directory,omitempty"`

	// InPlace restores each path over itself in the running guest,
	// replacing what is there. Never the default.
	// +optional
	InPlace bool `json:"inPlace,omitempty"`

	// PersistentVolumeClaim restores into a claim of this namespace
	// instead of the guest (for a VM that is stopped, deleted or does not
	// boot), written by a short-lived unprivileged Job with the VM's
	// credentials; attach it to a VM (virtctl addvolume) or mount it.
	// +optional
	PersistentVolumeClaim *RestoreClaim `json:"persistentVolumeClaim,omitempty"`
}

// RestoreClaim is the claim a GuestRestore writes into: an existing one
// (claimName), or a new one named after the request (size, and optionally
// storageClassName).
// +kubebuilder:validation:XValidation:rule="has(self.claimName) != has(self.size)",message="set persistentVolumeClaim.claimName to restore into an existing claim, or persistentVolumeClaim.size to create one named after the request"
// +kubebuilder:validation:XValidation:rule="!has(self.storageClassName) || has(self.size)",message="persistentVolumeClaim.storageClassName applies only to a claim created with size"
type RestoreClaim struct {
	// ClaimName is an existing PersistentVolumeClaim of this namespace.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ClaimName string `json:"claimName,omitempty"`

	// Size is the capacity of a new claim, named after the request.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// StorageClassName is the storage class of a new claim; default: the
	// cluster's default class.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
}

// GuestRestoreSpec is "restore these paths of a snapshot". Immutable.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a GuestRestore's spec cannot change: a request is one-shot; create a new GuestRestore instead"
// +kubebuilder:validation:XValidation:rule="!has(self.history) || !self.history || (has(self.dryRun) && self.dryRun && size(self.paths) == 1 && (!has(self.snapshot) || !has(self.snapshot.id)))",message="history lists the versions of one path across snapshots: set dryRun too, name exactly one path, and no snapshot.id (snapshot.before bounds the snapshots listed)"
type GuestRestoreSpec struct {
	// VM is the name of the VirtualMachine, in this request's namespace,
	// under whose identity the restore runs, and whose guest it restores
	// into unless target.persistentVolumeClaim is set. It must exist and
	// be opted in (annotation guestbackup.io/server).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	VM string `json:"vm"`

	// SourceVM is the VM, of this namespace, whose snapshots are restored
	// from; it may be deleted. Default: VM. Another VM's snapshots only
	// with VM's grant: its annotation guestbackup.io/restore-from names
	// SourceVM.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	SourceVM string `json:"sourceVM,omitempty"`

	// Snapshot chooses the snapshot; default: the latest.
	// +optional
	Snapshot SnapshotSelector `json:"snapshot,omitempty"`

	// Paths are the absolute paths, as snapshotted, to restore: files or
	// folders.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +listType=atomic
	Paths []string `json:"paths"`

	// Target is where the paths are restored; default: a fresh folder in
	// the guest, /var/lib/guestbackup/restores/<request name>.
	// +optional
	Target RestoreTarget `json:"target,omitempty"`

	// DryRun lists what would be restored into status.dryRun, and writes
	// nothing.
	// +optional
	DryRun bool `json:"dryRun,omitempty"`

	// History, with dryRun, lists instead the versions of the one path
	// across the source VM's snapshots into status.history: newest first,
	// at most MaxHistoryVersions of them, among those started before
	// snapshot.before when it is set. Nothing is written.
	// +optional
	History bool `json:"history,omitempty"`

	// Requester is who created this request: written by guestbackup's
	// webhook at creation, never by a client.
	// +optional
	Requester *Requester `json:"requester,omitempty"`
}

// RestoreProgress is what a restore has written so far.
type RestoreProgress struct {
	// Files is the number of files written.
	// +optional
	Files int64 `json:"files,omitempty"`
	// Bytes is the number of bytes written.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
}

// MaxDryRunEntries bounds status.dryRun.entries of a GuestRestore, so that
// a dry run of a large folder keeps the object well within etcd's limit.
const MaxDryRunEntries = 500

// DryRunEntry is one file or folder a restore would write.
type DryRunEntry struct {
	// Path is where it would be written.
	Path string `json:"path"`
	// Type is file, directory or symlink.
	// +kubebuilder:validation:Enum=file;directory;symlink
	Type string `json:"type"`
	// Size is its size in bytes (of a folder: its files').
	// +optional
	Size int64 `json:"size,omitempty"`
	// ModTime is its modification time in the snapshot.
	// +optional
	ModTime *metav1.Time `json:"modTime,omitempty"`
}

// DryRunListing is what a dry run found.
type DryRunListing struct {
	// Entries are the first entries in path order, at most 500.
	// +kubebuilder:validation:MaxItems=500
	// +listType=atomic
	// +optional
	Entries []DryRunEntry `json:"entries,omitempty"`
	// Files is the number of files the restore would write, all counted.
	// +optional
	Files int64 `json:"files,omitempty"`
	// Bytes is their size.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
	// Truncated is true when Entries lists only the first ones.
	// +optional
	Truncated bool `json:"truncated,omitempty"`
}

// MaxHistoryVersions bounds status.history of a GuestRestore: the newest
// versions of a path it lists.
const MaxHistoryVersions = 50

// PathVersion is a path as one snapshot holds it.
type PathVersion struct {
	// SnapshotID is the snapshot's Kopia ID (restore from it with
	// snapshot.id).
	SnapshotID string `json:"snapshotID"`
	// StartTime is when the guest started the snapshot.
	StartTime metav1.Time `json:"startTime"`
	// Type is file, directory or symlink.
	// +kubebuilder:validation:Enum=file;directory;symlink
	Type string `json:"type"`
	// Size is its size in bytes (of a folder: its files').
	// +optional
	Size int64 `json:"size,omitempty"`
	// ModTime is its modification time in the snapshot.
	// +optional
	ModTime *metav1.Time `json:"modTime,omitempty"`
	// Changed is true when its content differs from the version listed
	// after it (the next older), and for the oldest listed.
	// +optional
	Changed bool `json:"changed,omitempty"`
}

// GuestRestoreStatus is what became of a GuestRestore.
type GuestRestoreStatus struct {
	// Phase is Pending, Running, Succeeded or Failed; empty until the
	// request is picked up.
	// +optional
	Phase RequestPhase `json:"phase,omitempty"`

	// Conditions are the request's conditions.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Snapshots are the snapshots the selector chose, one per path: each
	// path is restored from a snapshot of the source VM's snapshot source
	// (guest path) that holds it.
	// +listType=atomic
	// +optional
	Snapshots []PathSnapshot `json:"snapshots,omitempty"`

	// Progress is what has been written so far, then in all.
	// +optional
	Progress RestoreProgress `json:"progress,omitempty"`

	// DryRun is what a dry run would restore.
	// +optional
	DryRun *DryRunListing `json:"dryRun,omitempty"`

	// History is, for a request with spec.history, the versions of its
	// path, newest first: one per snapshot that holds it.
	// +kubebuilder:validation:MaxItems=50
	// +listType=atomic
	// +optional
	History []PathVersion `json:"history,omitempty"`

	// StartTime is when the restore started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// CompletionTime is when it ended, whatever the outcome.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// Message says what happened, and on failure what to do about it.
	// +optional
	Message string `json:"message,omitempty"`
}

// GuestRestore asks for paths of a snapshot to be restored, under a VM's
// own identity.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=guestbackup
// +kubebuilder:printcolumn:name="VM",type=string,JSONPath=`.spec.vm`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.status.snapshots[0].id`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.sourceVM`,priority=1
// +kubebuilder:printcolumn:name="Requester",type=string,JSONPath=`.spec.requester.username`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GuestRestore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GuestRestoreSpec   `json:"spec"`
	Status GuestRestoreStatus `json:"status,omitempty"`
}

// GuestRestoreList is a list of GuestRestores.
// +kubebuilder:object:root=true
type GuestRestoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuestRestore `json:"items"`
}

func init() {
	SchemeBuilder.Register(&GuestSnapshot{}, &GuestSnapshotList{}, &GuestRestore{}, &GuestRestoreList{})
}
