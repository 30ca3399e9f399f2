// Package kopiaserver turns a BackupStorageLocationServer into a managed Kopia
// repository server: its repository, certificate, workload, users and status.
package kopiaserver

import (
	"fmt"
	"net/url"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// ServiceName is the name of the Service in front of a BSLS's server.
func ServiceName(bsls *v1alpha1.BackupStorageLocationServer) string {
	return bsls.Name
}

// Endpoint is the URL guests connect to: the admin's clientURL when set (for
// guests that cannot resolve cluster DNS), else the Service's cluster DNS name.
func Endpoint(bsls *v1alpha1.BackupStorageLocationServer) string {
	if bsls.Spec.ClientURL != "" {
		return bsls.Spec.ClientURL
	}
	port := bsls.Spec.Service.Port
	if port == 0 {
		port = v1alpha1.DefaultServerPort
	}
	return fmt.Sprintf("https://%s.%s.svc:%d", ServiceName(bsls), bsls.Namespace, port)
}

// EndpointHost is the host (DNS name or IP) of Endpoint: the name the server's
// certificate must be valid for, since guests verify it.
func EndpointHost(bsls *v1alpha1.BackupStorageLocationServer) string {
	u, err := url.Parse(Endpoint(bsls))
	if err != nil {
		// The CRD admits only https:// URLs; an unparsable one names no host
		// a certificate could match.
		return ""
	}
	return u.Hostname()
}
