package pki

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"net"
	"strings"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

func TestIssueServing(t *testing.T) {
	ca, err := NewCA("guestbackup test CA", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		dnsNames []string
		ips      []net.IP
		validFor time.Duration
		verify   string // host name or IP the leaf must verify for
		wantErr  string
	}{
		{name: "service DNS name", dnsNames: []string{"bsls.ns.svc", "bsls.ns.svc.cluster.local"}, validFor: time.Hour, verify: "bsls.ns.svc.cluster.local"},
		{name: "loopback IP", ips: []net.IP{net.IPv4(127, 0, 0, 1)}, validFor: time.Hour, verify: "127.0.0.1"},
		{name: "validity capped at the CA's", dnsNames: []string{"a.example"}, validFor: 1000 * time.Hour, verify: "a.example"},
		{name: "no names", validFor: time.Hour, wantErr: "at least one DNS name or IP address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kp, err := ca.IssueServing(tt.dnsNames, tt.ips, tt.validFor)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca.Cert)
			if _, err := kp.Cert.Verify(x509.VerifyOptions{DNSName: tt.verify, Roots: roots}); err != nil {
				t.Fatalf("leaf does not verify for %s against the CA: %v", tt.verify, err)
			}
			if kp.Cert.NotAfter.After(ca.Cert.NotAfter) {
				t.Errorf("leaf outlives its CA: %v > %v", kp.Cert.NotAfter, ca.Cert.NotAfter)
			}
			if kp.Cert.IsCA {
				t.Error("leaf is a CA")
			}
		})
	}
}

func TestChainPEMRoundTrip(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.IssueServing([]string{"server"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := certutil.ParseCertsPEM(kp.ChainPEM(ca.Cert))
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 2 || !certs[0].Equal(kp.Cert) || !certs[1].Equal(ca.Cert) {
		t.Fatalf("chain = %d certificates, want leaf then CA", len(certs))
	}
	for _, enc := range []func() ([]byte, error){ca.KeyPEM, kp.KeyPEM} {
		pemKey, err := enc()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(pemKey), "-----BEGIN PRIVATE KEY-----") {
			t.Errorf("key PEM starts with %q", strings.SplitN(string(pemKey), "\n", 2)[0])
		}
	}
}

// TestChainRejectsGarbage pins what ParseCerts did before client-go's
// ParseCertsPEM took its place: a bundle without a certificate is an error.
func TestChainRejectsGarbage(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string]string{
		"empty":        "",
		"not PEM":      "hello",
		"only a key":   "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"corrupt cert": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
	} {
		if _, err := Chain([]byte(in), ca.CertPEM()); err == nil {
			t.Errorf("%s as the certificate: no error", name)
		}
		if _, err := Chain(ca.CertPEM(), []byte(in)); err == nil {
			t.Errorf("%s as the CA: no error", name)
		}
		if _, err := ParseCA([]byte(in), nil); err == nil {
			t.Errorf("%s as a CA certificate: no error", name)
		}
	}
}

func TestFingerprint(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(ca.Cert.Raw)
	want := hex.EncodeToString(sum[:])
	if got := Fingerprint(ca.Cert); got != want {
		t.Fatalf("Fingerprint = %s, want %s", got, want)
	}
	if strings.ToLower(want) != want || len(want) != 64 {
		t.Fatalf("fingerprint %q is not 64 lowercase hex digits", want)
	}
}

func TestChain(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.IssueServing([]string{"server"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, caPEM := EncodeCert(kp.Cert), ca.CertPEM()
	for name, certPEM := range map[string][]byte{
		"leaf only (cert-manager's tls.crt)": leaf,
		"leaf and CA already":                append(append([]byte{}, leaf...), caPEM...),
	} {
		chain, err := Chain(certPEM, caPEM)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		certs, err := certutil.ParseCertsPEM(chain)
		if err != nil {
			t.Fatal(err)
		}
		if len(certs) != 2 || !certs[0].Equal(kp.Cert) || !certs[1].Equal(ca.Cert) {
			t.Errorf("%s: chain has %d certificates, want leaf then CA once", name, len(certs))
		}
	}
	if _, err := Chain(leaf, nil); err == nil || !strings.Contains(err.Error(), "CA") {
		t.Errorf("a missing CA: error = %v", err)
	}
}

func TestParseCA(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseCA(ca.CertPEM(), key)
	if err != nil || !parsed.Cert.Equal(ca.Cert) {
		t.Fatalf("ParseCA = %v, %v", parsed, err)
	}
	other, err := NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _ := other.KeyPEM()
	if _, err := ParseCA(ca.CertPEM(), otherKey); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("mismatched key: error = %v", err)
	}
	leaf, _ := ca.IssueServing([]string{"a"}, nil, time.Hour)
	leafKey, _ := leaf.KeyPEM()
	if _, err := ParseCA(EncodeCert(leaf.Cert), leafKey); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("a leaf as CA: error = %v", err)
	}
}
