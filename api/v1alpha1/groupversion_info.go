// Package v1alpha1 holds the guestbackup.io/v1alpha1 API: the
// BackupStorageLocationServer a cluster admin creates to run a managed Kopia
// repository server, the annotations and labels that tie VirtualMachines
// and their credential Secrets to it, each VM's GuestProtection, and the
// requests (GuestSnapshot, GuestRestore) VM owners make from the cluster.
//
// +kubebuilder:object:generate=true
// +groupName=guestbackup.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of this package's types.
	GroupVersion = schema.GroupVersion{Group: "guestbackup.io", Version: "v1alpha1"}

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
