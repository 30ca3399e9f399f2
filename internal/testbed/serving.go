package testbed

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/guestbackup/guestbackup/pkg/pki"
)

// WriteServingCert issues a serving certificate of ca for dnsNames and ips,
// valid for validFor, and writes it into dir the way a Secret of type
// kubernetes.io/tls is mounted: tls.crt with the chain (the leaf, then
// ca), tls.key with the key. It returns both files' paths, for servers
// that take them as flags or arguments.
func WriteServingCert(dir string, ca *pki.CA, dnsNames []string, ips []net.IP, validFor time.Duration) (certFile, keyFile string, err error) {
	leaf, err := ca.IssueServing(dnsNames, ips, validFor)
	if err != nil {
		return "", "", fmt.Errorf("issue the serving certificate: %w", err)
	}
	key, err := leaf.KeyPEM()
	if err != nil {
		return "", "", fmt.Errorf("encode the serving key: %w", err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, leaf.ChainPEM(ca.Cert), 0o600); err != nil {
		return "", "", fmt.Errorf("write the serving certificate: %w", err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		return "", "", fmt.Errorf("write the serving key: %w", err)
	}
	return certFile, keyFile, nil
}

// WriteLoopbackServingCert writes a serving certificate for 127.0.0.1, of
// a fresh CA valid for an hour, into dir as controller-runtime's webhook
// server reads a cert dir (tls.crt with the chain, tls.key), and returns
// that CA, for the server's clients.
func WriteLoopbackServingCert(dir string) (*pki.CA, error) {
	ca, err := pki.NewCA("test bed webhook", time.Hour)
	if err != nil {
		return nil, err
	}
	if _, _, err := WriteServingCert(dir, ca, nil, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour); err != nil {
		return nil, err
	}
	return ca, nil
}
