// Package pki issues the certificates a Kopia repository server presents when
// cert-manager is not there to do it.
//
// Guests trust the CA, not the leaf: they verify the server's chain to it and
// the host name they dial, so renewing the leaf never touches a guest. They
// never use Kopia's fingerprint pin, which accepts any chain that merely
// contains the pinned certificate; Fingerprint is for people comparing CAs.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// clockSkew backdates NotBefore so a certificate is valid at once on hosts
// whose clocks lag the issuer's a little.
const clockSkew = 5 * time.Minute

// CA is a certificate authority: its certificate and signing key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// KeyPair is an issued certificate and its private key.
type KeyPair struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA creates a self-signed CA with a new random key, valid for the
// given duration from now.
func NewCA(commonName string, validFor time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	return NewCAWithKey(commonName, key, validFor)
}

// caKeySalt separates the CA keys DeriveCAKey makes from any other use of
// the same secret.
const caKeySalt = "guestbackup.io/ca-key/v1"

// DeriveCAKey derives a P-256 CA key from secret, for the CA named by
// context (a BSLS's namespace/name and the key's generation): the same
// inputs always give the same key, so whoever holds secret can make the
// key again, and a CA certificate for it verifies the chains its guests
// already trust (they check a leaf against their CA's name and key, not its
// bytes). Its public key is public, so secret must be a random secret of at
// least 128 bits, never a password a person chose: HKDF is fast, and the
// certificate would let anyone test guesses of a weak one.
func DeriveCAKey(secret []byte, context string) (*ecdsa.PrivateKey, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("derive CA key: the secret is %d bytes, want at least 16", len(secret))
	}
	// A scalar must be below the curve's order: for P-256 a random 32
	// bytes is not with a chance of 2^-32, and the next counter is tried.
	for counter := range 16 {
		scalar, err := hkdf.Key(sha256.New, secret, []byte(caKeySalt), fmt.Sprintf("%s#%d", context, counter), 32)
		if err != nil {
			return nil, fmt.Errorf("derive CA key: %w", err)
		}
		if key, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), scalar); err == nil {
			return key, nil
		}
	}
	return nil, errors.New("derive CA key: no valid scalar in 16 tries")
}

// NewCAWithKey creates a self-signed CA for key, valid for the given
// duration from now.
func NewCAWithKey(commonName string, key *ecdsa.PrivateKey, validFor time.Duration) (*CA, error) {
	now := time.Now()
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA %q: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA %q: %w", commonName, err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// IssueServing issues a TLS server certificate for the given DNS names and
// IP addresses, valid for the given duration from now.
func (ca *CA) IssueServing(dnsNames []string, ips []net.IP, validFor time.Duration) (*KeyPair, error) {
	if len(dnsNames) == 0 && len(ips) == 0 {
		return nil, errors.New("a serving certificate needs at least one DNS name or IP address")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate serving key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(validFor)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	cn := ""
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign serving certificate for %v %v: %w", dnsNames, ips, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse serving certificate: %w", err)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

// CertPEM encodes the CA's certificate.
func (ca *CA) CertPEM() []byte { return EncodeCert(ca.Cert) }

// KeyPEM encodes the CA's private key.
func (ca *CA) KeyPEM() ([]byte, error) { return EncodeKey(ca.Key) }

// ChainPEM encodes the leaf followed by the CA: what a Kopia server
// presents, so that a client sees which CA issued it.
func (kp *KeyPair) ChainPEM(ca *x509.Certificate) []byte {
	return EncodeCerts(kp.Cert, ca)
}

// KeyPEM encodes the key pair's private key.
func (kp *KeyPair) KeyPEM() ([]byte, error) { return EncodeKey(kp.Key) }

// Fingerprint is the lowercase hex SHA-256 of the certificate's DER
// encoding, the form of Kopia's --server-cert-fingerprint.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// EncodeCert encodes a certificate as PEM.
func EncodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// EncodeCerts encodes certificates as one PEM bundle, in order.
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, EncodeCert(c)...)
	}
	return out
}

// EncodeKey encodes a private key as PKCS#8 PEM.
func EncodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return serial, nil
}

// Chain returns the certificates of certPEM (a leaf and any intermediates)
// followed by those of caPEM it does not already hold: the file a Kopia
// server presents (see ChainPEM). cert-manager
// writes the leaf in tls.crt and the CA in ca.crt; the result is PEM.
func Chain(certPEM, caPEM []byte) ([]byte, error) {
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	cas, err := certutil.ParseCertsPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	for _, ca := range cas {
		if !slices.ContainsFunc(certs, ca.Equal) {
			certs = append(certs, ca)
		}
	}
	return EncodeCerts(certs...), nil
}

// ParseCA decodes a CA's certificate and PKCS#8 EC key, as CertPEM and KeyPEM
// encode them, and checks that they belong together.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("CA key: no PEM block found")
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("CA key is a %T, want an ECDSA key", parsed)
	}
	if !key.PublicKey.Equal(certs[0].PublicKey) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	if !certs[0].IsCA {
		return nil, errors.New("CA certificate is not a CA")
	}
	return &CA{Cert: certs[0], Key: key}, nil
}
