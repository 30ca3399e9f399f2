package serverpod

import (
	"context"
	"errors"
	"fmt"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/blob/filesystem"
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
}

// FilesystemLocation is a folder, on the BSLS's volume, holding the repository.
type FilesystemLocation struct {
	Path string
}

// S3Location is a bucket and prefix, with the credentials to reach it.
type S3Location struct {
	Bucket, Endpoint, Region, Prefix string
	DisableTLS                       bool
	CABundle                         []byte
	AccessKeyID, SecretAccessKey     string
	SessionToken                     string
}

func (s Storage) open(ctx context.Context, create bool) (blob.Storage, error) {
	switch {
	case s.Filesystem != nil && s.S3 == nil:
		st, err := filesystem.New(ctx, &filesystem.Options{Path: s.Filesystem.Path}, create)
		if err != nil {
			return nil, fmt.Errorf("open filesystem storage %s: %w", s.Filesystem.Path, err)
		}
		return st, nil
	case s.S3 != nil && s.Filesystem == nil:
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
	default:
		return nil, errors.New("storage: set exactly one of filesystem and S3")
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
