package testbed

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/guestbackup/guestbackup/pkg/pki"
)

// WriteLoopbackServingCert writes a serving certificate for 127.0.0.1, of
// a fresh CA valid for an hour, into dir as controller-runtime's webhook
// server reads a cert dir (tls.crt with the chain, tls.key), and returns
// that CA, for the server's clients.
func WriteLoopbackServingCert(dir string) (*pki.CA, error) {
	ca, err := pki.NewCA("test bed webhook", time.Hour)
	if err != nil {
		return nil, err
	}
	leaf, err := ca.IssueServing(nil, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		return nil, err
	}
	key, err := leaf.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), leaf.ChainPEM(ca.Cert), 0o600); err != nil {
		return nil, fmt.Errorf("write the serving certificate: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600); err != nil {
		return nil, fmt.Errorf("write the serving key: %w", err)
	}
	return ca, nil
}
