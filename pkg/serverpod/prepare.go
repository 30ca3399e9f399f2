package serverpod

import (
	"context"
	"fmt"
	"os"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// PrepareOptions is what a server pod's init container needs to get the
// Kopia server going.
type PrepareOptions struct {
	Storage Storage
	// ConfigFile receives the repository connection the server and the
	// user-sync container share.
	ConfigFile string
	Password   string
	Defaults   *v1alpha1.PolicySpec
	// TLSCertFile and TLSCAFile are the mounted certificate Secret's
	// tls.crt and ca.crt; ChainFile receives leaf + CA for the server.
	TLSCertFile, TLSCAFile, ChainFile string
	// HtpasswdFile, when set, is created empty: the Kopia server's
	// --htpasswd-file must exist when it starts, and user sync writes the
	// credentials of its own process there.
	HtpasswdFile string
}

// Prepare connects to (or creates) the repository and writes the chain the
// server presents. It reports whether it created the repository.
func Prepare(ctx context.Context, o PrepareOptions) (created bool, err error) {
	cert, err := os.ReadFile(o.TLSCertFile)
	if err != nil {
		return false, fmt.Errorf("read server certificate: %w", err)
	}
	ca, err := os.ReadFile(o.TLSCAFile)
	if err != nil {
		return false, fmt.Errorf("read CA certificate: %w", err)
	}
	chain, err := pki.Chain(cert, ca)
	if err != nil {
		return false, fmt.Errorf("build the chain from %s and %s: %w", o.TLSCertFile, o.TLSCAFile, err)
	}
	if err := os.WriteFile(o.ChainFile, chain, 0o600); err != nil {
		return false, fmt.Errorf("write %s: %w", o.ChainFile, err)
	}
	if o.HtpasswdFile != "" {
		if err := os.WriteFile(o.HtpasswdFile, nil, 0o600); err != nil {
			return false, fmt.Errorf("create %s: %w", o.HtpasswdFile, err)
		}
	}
	return ConnectOrCreate(ctx, o.Storage, o.ConfigFile, o.Password, o.Defaults)
}
