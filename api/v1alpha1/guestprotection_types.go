package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GuestProtection conditions.
const (
	// ConditionGuestConnected is True once the guest's first snapshot
	// reached its server, False while a running VM's guest has not
	// connected for longer than the controller waits (GuestNotConnected),
	// Unknown before either.
	ConditionGuestConnected = "GuestConnected"
	// ConditionBackupFresh is False while the VM's newest snapshot is older
	// than its schedule allows (BackupStale), True otherwise once it has
	// one.
	ConditionBackupFresh = "BackupFresh"
)

// MaxRecentSnapshots bounds a GuestProtection's catalogue
// (status.recentSnapshots): the newest snapshots of a guest, published by
// its server pod for every guest of the server, at 10,000 guests too.
const MaxRecentSnapshots = 10

// GuestSnapshotSummary is one snapshot of a guest, as its owner sees it.
type GuestSnapshotSummary struct {
	// ID is Kopia's snapshot (manifest) ID.
	ID string `json:"id"`
	// Path is the folder of the guest the snapshot holds.
	Path string `json:"path"`
	// StartTime and EndTime are when the guest took it.
	StartTime metav1.Time `json:"startTime"`
	EndTime   metav1.Time `json:"endTime"`
	// Bytes and Files are the size and file count of what it holds.
	Bytes int64 `json:"bytes"`
	Files int32 `json:"files"`
}

// GuestProtectionStatus is what the controller knows of a VM's backups.
type GuestProtectionStatus struct {
	// Server is the BackupStorageLocationServer (namespace/name) the VM
	// backs up to.
	// +optional
	Server string `json:"server,omitempty"`
	// Identity is the guest's Kopia user (user@host), the name its
	// snapshots carry on the server.
	// +optional
	Identity string `json:"identity,omitempty"`
	// Snapshots is how many snapshots the guest has on its server.
	// +optional
	Snapshots int32 `json:"snapshots"`
	// FirstSnapshotTime is when the oldest snapshot the server has seen of
	// it was written.
	// +optional
	FirstSnapshotTime *metav1.Time `json:"firstSnapshotTime,omitempty"`
	// LastSnapshot is the newest snapshot.
	// +optional
	LastSnapshot *GuestSnapshotSummary `json:"lastSnapshot,omitempty"`
	// RecentSnapshots is the catalogue of the guest's complete snapshots,
	// newest first: at most MaxRecentSnapshots of them, fewer when their
	// paths are long or the server's catalogue shard holds more guests
	// than it plans for (Snapshots counts them all). A snapshot that
	// retention deleted leaves it. Pick one here to restore from
	// (GuestRestore spec.snapshot).
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	// +optional
	RecentSnapshots []GuestSnapshotSummary `json:"recentSnapshots,omitempty"`
	// Conditions: GuestConnected and BackupFresh.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// GuestProtection shows a VM's owner how the VM is backed up: its
// snapshots on the server, the newest one, whether its guest connected and
// whether its backups are fresh. The controller keeps one, named as the VM,
// in the VM's namespace for every VM that opted in, and it goes with the
// VM; so the namespace's view role is enough to see it, without reading
// the server's namespace or the VM's Secret. It is written by the
// controller only: it has no spec.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=gprot,categories=guestbackup
// +kubebuilder:printcolumn:name="Snapshots",type=integer,JSONPath=`.status.snapshots`
// +kubebuilder:printcolumn:name="Last Backup",type=date,JSONPath=`.status.lastSnapshot.endTime`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.lastSnapshot.bytes`,priority=1
// +kubebuilder:printcolumn:name="Connected",type=string,JSONPath=`.status.conditions[?(@.type=="GuestConnected")].status`
// +kubebuilder:printcolumn:name="Fresh",type=string,JSONPath=`.status.conditions[?(@.type=="BackupFresh")].status`
// +kubebuilder:printcolumn:name="Server",type=string,JSONPath=`.status.server`,priority=1
type GuestProtection struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Status GuestProtectionStatus `json:"status,omitempty"`
}

// GuestProtectionList is a list of GuestProtections.
// +kubebuilder:object:root=true
type GuestProtectionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuestProtection `json:"items"`
}

func init() {
	SchemeBuilder.Register(&GuestProtection{}, &GuestProtectionList{})
}
