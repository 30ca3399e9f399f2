package kopiaserver

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	certutil "k8s.io/client-go/util/cert"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// Lifetimes of the certificates the controller issues itself (without
// cert-manager). The CA is the guests' pin: it lives long. The leaf is
// renewed once two thirds of its life have passed.
const (
	selfManagedCALifetime   = 10 * 365 * 24 * time.Hour
	selfManagedLeafLifetime = 90 * 24 * time.Hour
)

// CASecretName holds the self-managed CA (tls.crt, tls.key). It outlives the
// BSLS like the repository password: it is what guests trust.
func CASecretName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-ca" }

// ServingNames are the names the server's certificate is valid for: the
// Service's DNS names, and the clientURL's host when the admin set one.
func ServingNames(b *v1alpha1.BackupStorageLocationServer) (dnsNames []string, ips []net.IP) {
	svc := ServiceName(b)
	dnsNames = []string{svc, svc + "." + b.Namespace, svc + "." + b.Namespace + ".svc", svc + "." + b.Namespace + ".svc.cluster.local"}
	if u, err := url.Parse(b.Spec.ClientURL); err == nil && u.Hostname() != "" {
		if ip := net.ParseIP(u.Hostname()); ip != nil {
			ips = append(ips, ip)
		} else {
			dnsNames = append(dnsNames, u.Hostname())
		}
	}
	return dnsNames, ips
}

// tlsMaterial is a server certificate Secret's content, checked.
type tlsMaterial struct {
	// CA holds the certificates of ca.crt that anchor the leaf's chain,
	// re-encoded: what guests trust.
	CA []byte
	// Pin is the SHA-256 of the first of them, shown in the status.
	Pin string
	// Checksum changes whenever any of the three files does.
	Checksum string
}

// checkTLSSecret verifies that a Secret holds a usable server certificate:
// tls.crt, tls.key and a ca.crt that signed tls.crt for host, the host
// guests dial. Guests verify both, so a certificate that fails either would
// fail every guest. Guests are given only the certificates of ca.crt that
// anchor the leaf's chain, not whatever else ca.crt holds. The problem it
// returns names the Secret and what is wrong.
func checkTLSSecret(s *corev1.Secret, host string) (*tlsMaterial, *problem) {
	leaf, cas, p := checkTLSStructure(s)
	if p != nil {
		return nil, p
	}
	if host == "" {
		return nil, &problem{ReasonTLSSecretInvalid, "the endpoint guests connect to names no host (spec.clientURL): no certificate can be checked against it"}
	}
	roots := verifiedRoots(leaf, cas, host)
	if len(roots) == 0 {
		return nil, &problem{ReasonTLSSecretInvalid, fmt.Sprintf("Secret %s: tls.crt is not valid for %s, the host guests connect to (spec.clientURL, else the Service's DNS name), and guests check it: add it to the certificate's names", s.Name, host)}
	}
	sum := sha256.New()
	for _, key := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, "ca.crt"} {
		sum.Write(s.Data[key])
	}
	return &tlsMaterial{CA: pki.EncodeCerts(roots...), Pin: pki.Fingerprint(roots[0]), Checksum: hex.EncodeToString(sum.Sum(nil))}, nil
}

// checkTLSStructure checks what does not depend on the host: the three
// keys, and a tls.crt that verifies against ca.crt.
func checkTLSStructure(s *corev1.Secret) (leaf, cas []*x509.Certificate, p *problem) {
	for _, key := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, "ca.crt"} {
		if len(s.Data[key]) == 0 {
			return nil, nil, &problem{ReasonTLSSecretInvalid, fmt.Sprintf("Secret %s has no key %s (the server needs tls.crt, tls.key and ca.crt, the CA guests trust)", s.Name, key)}
		}
	}
	leaf, err := certutil.ParseCertsPEM(s.Data[corev1.TLSCertKey])
	if err != nil {
		return nil, nil, &problem{ReasonTLSSecretInvalid, fmt.Sprintf("Secret %s, key tls.crt: %v", s.Name, err)}
	}
	cas, err = certutil.ParseCertsPEM(s.Data["ca.crt"])
	if err != nil {
		return nil, nil, &problem{ReasonTLSSecretInvalid, fmt.Sprintf("Secret %s, key ca.crt: %v", s.Name, err)}
	}
	if len(verifiedRoots(leaf, cas, "")) == 0 {
		return nil, nil, &problem{ReasonTLSSecretInvalid, fmt.Sprintf("Secret %s: tls.crt does not verify against the CA in ca.crt", s.Name)}
	}
	return leaf, cas, nil
}

// selfManagedTLS returns the CA and serving Secrets' data the controller
// keeps without cert-manager: the CA is created once (its key from keys)
// and kept; the leaf is (re)issued when missing, expiring, or not valid for
// the current names. samePin says that a CA it created is the certificate
// guests already pin (status.tlsCA), made again from its derived key.
func selfManagedTLS(b *v1alpha1.BackupStorageLocationServer, keys caKeySource, caData, leafData map[string][]byte, now time.Time) (newCA, newLeaf map[string][]byte, samePin bool, err error) {
	var ca *pki.CA
	if len(caData[corev1.TLSCertKey]) > 0 {
		ca, err = pki.ParseCA(caData[corev1.TLSCertKey], caData[corev1.TLSPrivateKeyKey])
		if err != nil {
			return nil, nil, false, fmt.Errorf("Secret %s: %w", CASecretName(b), err)
		}
	} else {
		if ca, samePin, err = keys.newCA(b, now); err != nil {
			return nil, nil, false, err
		}
		key, err := ca.KeyPEM()
		if err != nil {
			return nil, nil, false, err
		}
		newCA = map[string][]byte{corev1.TLSCertKey: ca.CertPEM(), corev1.TLSPrivateKeyKey: key}
	}
	dnsNames, ips := ServingNames(b)
	if newCA == nil && leafValid(leafData, ca, dnsNames, ips, now) {
		return nil, nil, false, nil
	}
	kp, err := ca.IssueServing(dnsNames, ips, selfManagedLeafLifetime)
	if err != nil {
		return nil, nil, false, err
	}
	key, err := kp.KeyPEM()
	if err != nil {
		return nil, nil, false, err
	}
	return newCA, map[string][]byte{corev1.TLSCertKey: pki.EncodeCert(kp.Cert), corev1.TLSPrivateKeyKey: key, "ca.crt": ca.CertPEM()}, samePin, nil
}

// leafValid reports whether a serving Secret holds a leaf of ca, for all
// names, with more than a third of its life left.
func leafValid(data map[string][]byte, ca *pki.CA, dnsNames []string, ips []net.IP, now time.Time) bool {
	certs, err := certutil.ParseCertsPEM(data[corev1.TLSCertKey])
	if err != nil || len(data[corev1.TLSPrivateKeyKey]) == 0 || string(data["ca.crt"]) != string(ca.CertPEM()) {
		return false
	}
	leaf := certs[0]
	if leaf.CheckSignatureFrom(ca.Cert) != nil {
		return false
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	if now.After(leaf.NotAfter.Add(-life / 3)) {
		return false
	}
	for _, n := range dnsNames {
		if leaf.VerifyHostname(n) != nil {
			return false
		}
	}
	for _, ip := range ips {
		if leaf.VerifyHostname(ip.String()) != nil {
			return false
		}
	}
	return true
}

// verifiedRoots returns the certificates of cas that anchor a verified
// chain from chain[0] (leaf first, then intermediates) for host, or for any
// host when host is empty; none when it does not verify.
func verifiedRoots(chain, cas []*x509.Certificate, host string) []*x509.Certificate {
	roots, intermediates := x509.NewCertPool(), x509.NewCertPool()
	for _, c := range cas {
		roots.AddCert(c)
	}
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	chains, err := chain[0].Verify(x509.VerifyOptions{DNSName: host, Roots: roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return nil
	}
	var anchors []*x509.Certificate
	for _, c := range chains {
		root := c[len(c)-1]
		if !slices.ContainsFunc(anchors, root.Equal) {
			anchors = append(anchors, root)
		}
	}
	return anchors
}
