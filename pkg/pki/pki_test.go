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

func TestDeriveCAKey(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	first, err := DeriveCAKey(secret, "backup/main#0")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		secret   []byte
		context  string
		wantSame bool
		wantErr  string
	}{
		{name: "the same secret and context give the same key", secret: secret, context: "backup/main#0", wantSame: true},
		{name: "another generation gives another key", secret: secret, context: "backup/main#1"},
		{name: "another BSLS gives another key", secret: secret, context: "backup/other#0"},
		{name: "another secret gives another key", secret: []byte("0123456789abcdef0123456789abcdeF"), context: "backup/main#0"},
		{name: "a short secret is refused", secret: []byte("short"), context: "backup/main#0", wantErr: "at least 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := DeriveCAKey(tt.secret, tt.context)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if same := key.Equal(first); same != tt.wantSame {
				t.Fatalf("key equals the first: %v, want %v", same, tt.wantSame)
			}
		})
	}
}

// A guest keeps the CA certificate its bootstrap gave it. A CA made again
// for the same derived key is another certificate, but the guest's TLS
// verification matches the issuer by name and key, so the leaves it issues
// verify against the certificate the guest already has; a CA of the same
// name with any other key does not.
func TestALeafOfACAMadeAgainForItsKeyVerifiesAgainstTheFirstCertificate(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	const name = "backup/main guestbackup CA"
	key, err := DeriveCAKey(secret, "backup/main#0")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := NewCAWithKey(name, key, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	guest := x509.NewCertPool()
	guest.AddCert(kept.Cert)

	again, err := DeriveCAKey(secret, "backup/main#0")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA(name, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		ca     *CA // nil: made again for the derived key
		verify bool
	}{
		{name: "made again for the derived key", verify: true},
		{name: "another key under the same name", ca: other},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ca := tt.ca
			if ca == nil {
				if ca, err = NewCAWithKey(name, again, 48*time.Hour); err != nil {
					t.Fatal(err)
				}
				if ca.Cert.Equal(kept.Cert) {
					t.Fatal("the CA made again is the same certificate: the test would prove nothing")
				}
			}
			leaf, err := ca.IssueServing([]string{"main.backup.svc"}, nil, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			// The server presents its leaf and its CA, as Chain writes them.
			presented := x509.NewCertPool()
			presented.AddCert(ca.Cert)
			_, err = leaf.Cert.Verify(x509.VerifyOptions{DNSName: "main.backup.svc", Roots: guest, Intermediates: presented})
			if tt.verify && err != nil {
				t.Fatalf("the guest's kept certificate does not verify the new leaf: %v", err)
			}
			if !tt.verify && err == nil {
				t.Fatal("a leaf of another key verified against the guest's CA")
			}
		})
	}
}
