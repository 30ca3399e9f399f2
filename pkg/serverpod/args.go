package serverpod

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/guestbackup/guestbackup/pkg/serverargs"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
)

// InitOptionsFrom is what init's command line a asks Init to do, with the
// S3 CA bundle a names read. The repository password, the API client that
// reads a Velero credential Secret and Out are the caller's to add: they
// are not arguments.
func InitOptionsFrom(a serverargs.Init) (InitOptions, error) {
	o := InitOptions{
		PrepareOptions: PrepareOptions{
			ConfigFile: a.ConfigFile, TLSCertFile: a.TLSCertFile, TLSCAFile: a.TLSCAFile, ChainFile: a.ChainFile,
			HtpasswdFile: a.HtpasswdFile,
		},
		WorkloadIdentity: a.WorkloadIdentity,
		AppendOnly:       a.AppendOnly,
	}
	if a.Maintenance {
		if a.Namespace == "" || a.BSLS == "" {
			return InitOptions{}, errors.New("--maintenance needs --namespace and --bsls")
		}
		o.Maintenance = &MaintenanceOptions{Namespace: a.Namespace, BSLS: a.BSLS,
			Schedule: maintenance.Schedule{Quick: a.MaintenanceQuickInterval, Full: a.MaintenanceFullInterval}}
	}
	var err error
	if o.Defaults, err = ParsePolicy(a.DefaultPolicy); err != nil {
		return InitOptions{}, fmt.Errorf("--default-policy: %w", err)
	}
	if o.Storage, err = storageFrom(a); err != nil {
		return InitOptions{}, err
	}
	if a.CredentialsSecret != "" {
		ns, name, ok := strings.Cut(a.CredentialsSecret, "/")
		if !ok || ns == "" || name == "" {
			return InitOptions{}, fmt.Errorf("--credentials-secret %q: want <namespace>/<name>", a.CredentialsSecret)
		}
		o.Velero = &VeleroCredentials{Namespace: ns, Name: name, Key: a.CredentialsKey, Profile: a.CredentialsProfile,
			AzureStorageKeyVariable: a.AzureStorageKeyVariable}
	}
	return o, nil
}

// storageFrom is the one storage a names, with its S3 CA bundle read.
func storageFrom(a serverargs.Init) (Storage, error) {
	var s Storage
	switch kinds := countSet(a.FilesystemPath, a.S3Bucket, a.GCSBucket, a.AzureContainer); {
	case kinds != 1:
		return s, errors.New("set exactly one of --filesystem-path, --s3-bucket, --gcs-bucket and --azure-container")
	case a.FilesystemPath != "":
		s.Filesystem = &FilesystemLocation{Path: a.FilesystemPath}
	case a.S3Bucket != "":
		s.S3 = &S3Location{Bucket: a.S3Bucket, Endpoint: a.S3Endpoint, Region: a.S3Region, Prefix: a.S3Prefix, DisableTLS: a.S3DisableTLS}
		if a.S3CAFile != "" {
			var err error
			if s.S3.CABundle, err = os.ReadFile(a.S3CAFile); err != nil {
				return s, fmt.Errorf("read S3 CA bundle: %w", err)
			}
		}
	case a.GCSBucket != "":
		s.GCS = &GCSLocation{Bucket: a.GCSBucket, Prefix: a.GCSPrefix}
	default:
		s.Azure = &AzureLocation{Container: a.AzureContainer, Prefix: a.AzurePrefix, StorageAccount: a.AzureStorageAccount,
			StorageDomain: a.AzureStorageDomain, DisableTLS: a.AzureDisableTLS}
	}
	return s, nil
}

// countSet counts the values that are not empty.
func countSet(values ...string) int {
	n := 0
	for _, v := range values {
		if v != "" {
			n++
		}
	}
	return n
}
