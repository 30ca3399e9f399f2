package serverpod

import (
	"context"
	"errors"
	"fmt"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/blob/azure"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/repo/blob/gcs"
	"github.com/kopia/kopia/repo/blob/s3"
	"github.com/kopia/kopia/repo/compression"
	"github.com/kopia/kopia/snapshot/policy"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/serverpod/retention"
)

// Storage is where a repository lives, as the server pod reaches it.
// Exactly one field is set.
type Storage struct {
	Filesystem *FilesystemLocation
	S3         *S3Location
	GCS        *GCSLocation
	Azure      *AzureLocation
}

// FilesystemLocation is a folder, on the BSLS's volume, holding the repository.
type FilesystemLocation struct {
	Path string
}

// S3Location is a bucket and prefix, with the credentials to reach it.
// Without AccessKeyID and SecretAccessKey Kopia falls back to the
// environment (AWS_ACCESS_KEY_ID...) and then to the instance's or the
// pod's identity (IRSA's AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN).
type S3Location struct {
	Bucket, Endpoint, Region, Prefix string
	DisableTLS                       bool
	CABundle                         []byte
	AccessKeyID, SecretAccessKey     string
	SessionToken                     string
}

// GCSLocation is a Google Cloud Storage bucket and prefix. Without
// CredentialsJSON (a service account's JSON key) Kopia uses Google's
// application default credentials: on GKE with Workload Identity, the
// metadata server's token for the ServiceAccount's Google identity.
type GCSLocation struct {
	Bucket, Prefix  string
	CredentialsJSON []byte
}

// AzureLocation is an Azure Blob Storage container and prefix in a storage
// account, reached at https://<StorageAccount>.<StorageDomain>/ (default
// domain blob.core.windows.net), with a storage account key, a service
// principal's secret, or Azure Workload Identity's federated token: Kopia
// uses no ambient credential by itself, so a workload identity's is set
// here from the environment its webhook gives the pod.
type AzureLocation struct {
	Container, Prefix, StorageAccount, StorageDomain string
	DisableTLS                                       bool
	StorageKey                                       string
	TenantID, ClientID, ClientSecret                 string
	FederatedTokenFile                               string
}

func (s Storage) open(ctx context.Context, create bool) (blob.Storage, error) {
	set := 0
	for _, ok := range []bool{s.Filesystem != nil, s.S3 != nil, s.GCS != nil, s.Azure != nil} {
		if ok {
			set++
		}
	}
	if set != 1 {
		return nil, errors.New("storage: set exactly one of filesystem, S3, GCS and Azure")
	}
	switch {
	case s.Filesystem != nil:
		st, err := filesystem.New(ctx, &filesystem.Options{Path: s.Filesystem.Path}, create)
		if err != nil {
			return nil, fmt.Errorf("open filesystem storage %s: %w", s.Filesystem.Path, err)
		}
		return st, nil
	case s.S3 != nil:
		endpoint := s.S3.Endpoint
		if endpoint == "" {
			endpoint = "s3.amazonaws.com"
		}
		st, err := s3.New(ctx, &s3.Options{
			BucketName: s.S3.Bucket, Prefix: s.S3.Prefix, Endpoint: endpoint, Region: s.S3.Region,
			DoNotUseTLS: s.S3.DisableTLS, RootCA: s.S3.CABundle,
			AccessKeyID: s.S3.AccessKeyID, SecretAccessKey: s.S3.SecretAccessKey, SessionToken: s.S3.SessionToken,
		}, create)
		if err != nil {
			return nil, fmt.Errorf("open S3 storage s3://%s/%s at %s: %w", s.S3.Bucket, s.S3.Prefix, endpoint, err)
		}
		return st, nil
	case s.GCS != nil:
		st, err := gcs.New(ctx, &gcs.Options{BucketName: s.GCS.Bucket, Prefix: s.GCS.Prefix, ServiceAccountCredentialJSON: s.GCS.CredentialsJSON}, create)
		if err != nil {
			return nil, fmt.Errorf("open Google Cloud Storage gs://%s/%s: %w", s.GCS.Bucket, s.GCS.Prefix, err)
		}
		return st, nil
	default:
		a := s.Azure
		st, err := azure.New(ctx, &azure.Options{
			Container: a.Container, Prefix: a.Prefix, StorageAccount: a.StorageAccount, StorageDomain: a.StorageDomain,
			DoNotUseTLS: a.DisableTLS, StorageKey: a.StorageKey,
			TenantID: a.TenantID, ClientID: a.ClientID, ClientSecret: a.ClientSecret, AzureFederatedTokenFile: a.FederatedTokenFile,
		}, create)
		if err != nil {
			return nil, fmt.Errorf("open Azure Blob Storage container %s/%s of storage account %s: %w", a.Container, a.Prefix, a.StorageAccount, err)
		}
		return st, nil
	}
}

// ConnectOrCreate connects configFile to the repository in storage. When the
// storage holds no repository yet, it creates one first and gives it Kopia's
// default global policy with the admin's changes; an existing repository, and its policy, are not
// touched here (Init applies the admin's edits: ApplyPolicy). It reports whether it created the
// repository.
func ConnectOrCreate(ctx context.Context, s Storage, configFile, password string, defaults *v1alpha1.PolicySpec) (created bool, err error) {
	st, err := s.open(ctx, true)
	if err != nil {
		return false, err
	}
	defer st.Close(ctx) //nolint:errcheck // read-mostly handle; errors surface on use

	err = repo.Initialize(ctx, st, &repo.NewRepositoryOptions{}, password)
	switch {
	case err == nil:
		created = true
	case errors.Is(err, repo.ErrAlreadyInitialized):
	default:
		return false, fmt.Errorf("create repository: %w", err)
	}
	if err := repo.Connect(ctx, configFile, st, password, &repo.ConnectOptions{}); err != nil {
		return created, fmt.Errorf("connect to repository: %w", err)
	}
	if !created {
		return created, nil
	}
	r, err := repo.Open(ctx, configFile, password, &repo.Options{})
	if err != nil {
		return created, fmt.Errorf("open new repository: %w", err)
	}
	defer r.Close(ctx) //nolint:errcheck // the write session below flushed what matters
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup default policy"},
		func(ctx context.Context, w repo.RepositoryWriter) error {
			// What `kopia repository create` sets, with the admin's changes.
			global := *policy.DefaultPolicy
			if defaults != nil {
				applyDefaults(&global, defaults)
			}
			return policy.SetPolicy(ctx, w, policy.GlobalPolicySourceInfo, &global)
		})
	if err != nil {
		return created, fmt.Errorf("set default policy: %w", err)
	}
	return created, nil
}

// applyDefaults sets on p what the admin's policy says, leaving the rest as
// Kopia's defaults.
func applyDefaults(p *policy.Policy, d *v1alpha1.PolicySpec) {
	// On an append-only server, user sync then makes this retention keep
	// everything (guests trigger it, with their own clocks) and applies
	// the same admin retention itself on the server's clock: see package
	// retention.
	p.RetentionPolicy = retention.FromSpec(d)
	if d.Compression != "" {
		p.CompressionPolicy.CompressorName = compression.Name(d.Compression)
	}
}
