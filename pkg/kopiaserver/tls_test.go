package kopiaserver

import (
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

func TestSelfManagedTLS(t *testing.T) {
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}}
	now := time.Now()

	ca, leaf, _, err := selfManagedTLS(b, caKeySource{}, nil, nil, now)
	if err != nil || ca == nil || leaf == nil {
		t.Fatalf("first run: CA %v, leaf %v, error %v; want both issued", ca != nil, leaf != nil, err)
	}
	m, p := checkTLSSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "main-tls"}, Data: leaf}, EndpointHost(b))
	if p != nil {
		t.Fatalf("issued leaf does not check: %s", p.Message)
	}
	caCerts, _ := certutil.ParseCertsPEM(ca[corev1.TLSCertKey])
	if m.Pin != pki.Fingerprint(caCerts[0]) {
		t.Errorf("pin %s is not the CA's fingerprint", m.Pin)
	}

	if newCA, newLeaf, _, err := selfManagedTLS(b, caKeySource{}, ca, leaf, now.Add(time.Hour)); err != nil || newCA != nil || newLeaf != nil {
		t.Errorf("a valid leaf: CA %v, leaf %v, error %v; want nothing new", newCA != nil, newLeaf != nil, err)
	}

	renewal := now.Add(2*selfManagedLeafLifetime/3 + time.Hour)
	newCA, newLeaf, _, err := selfManagedTLS(b, caKeySource{}, ca, leaf, renewal)
	if err != nil || newCA != nil || newLeaf == nil {
		t.Fatalf("two thirds into its life: CA %v, leaf %v, error %v; want a new leaf only", newCA != nil, newLeaf != nil, err)
	}
	if m2, p := checkTLSSecret(&corev1.Secret{Data: newLeaf}, EndpointHost(b)); p != nil || m2.Pin != m.Pin || m2.Checksum == m.Checksum {
		t.Errorf("renewed leaf: problem %v, same pin %v, new checksum %v", p, m2 != nil && m2.Pin == m.Pin, m2 != nil && m2.Checksum != m.Checksum)
	}

	moved := b.DeepCopy()
	moved.Spec.ClientURL = "https://10.0.2.2:51515"
	if _, newLeaf, _, _ := selfManagedTLS(moved, caKeySource{}, ca, leaf, now); newLeaf == nil {
		t.Error("a new clientURL host: the leaf was not re-issued for it")
	} else if certs, _ := certutil.ParseCertsPEM(newLeaf[corev1.TLSCertKey]); certs[0].VerifyHostname("10.0.2.2") != nil {
		t.Error("the re-issued leaf is not valid for the clientURL's IP")
	}

	broken := map[string][]byte{corev1.TLSCertKey: ca[corev1.TLSCertKey], corev1.TLSPrivateKeyKey: []byte("not a key")}
	if _, _, _, err := selfManagedTLS(b, caKeySource{}, broken, leaf, now); err == nil || !strings.Contains(err.Error(), "Secret main-ca") {
		t.Errorf("a broken CA Secret: error = %v, want one naming Secret main-ca", err)
	}
}

func TestCheckTLSSecret(t *testing.T) {
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}}
	ca, leaf, _, err := selfManagedTLS(b, caKeySource{}, nil, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	other, _, _, err := selfManagedTLS(b, caKeySource{}, nil, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	with := func(key string, value []byte) map[string][]byte {
		d := maps.Clone(leaf)
		if value == nil {
			delete(d, key)
		} else {
			d[key] = value
		}
		return d
	}
	for _, tt := range []struct {
		name string
		data map[string][]byte
		host string
		want string // the problem's message; empty: usable
	}{
		{name: "issued for the Service's name", data: leaf, host: "main.backup.svc"},
		{name: "ca.crt also holding an unrelated CA, which guests are not given", host: "main.backup.svc",
			data: with("ca.crt", append(append([]byte{}, other[corev1.TLSCertKey]...), ca[corev1.TLSCertKey]...))},
		{name: "an endpoint with no host", data: leaf, host: "",
			want: "the endpoint guests connect to names no host (spec.clientURL): no certificate can be checked against it"},
		{name: "no ca.crt", data: with("ca.crt", nil), host: "main.backup.svc",
			want: "Secret mine has no key ca.crt (the server needs tls.crt, tls.key and ca.crt, the CA guests trust)"},
		{name: "signed by another CA", data: with("ca.crt", other[corev1.TLSCertKey]), host: "main.backup.svc",
			want: "Secret mine: tls.crt does not verify against the CA in ca.crt"},
		{name: "not valid for the host guests dial", data: leaf, host: "backup.example.com",
			want: "Secret mine: tls.crt is not valid for backup.example.com, the host guests connect to (spec.clientURL, else the Service's DNS name), and guests check it: add it to the certificate's names"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, p := checkTLSSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mine"}, Data: tt.data}, tt.host)
			switch {
			case tt.want == "" && p != nil:
				t.Fatalf("problem %q", p.Message)
			case tt.want == "":
				if string(m.CA) != string(ca[corev1.TLSCertKey]) {
					t.Errorf("CA guests trust:\n%s\nwant the CA that signed the leaf:\n%s", m.CA, ca[corev1.TLSCertKey])
				}
			case p == nil || p.Reason != ReasonTLSSecretInvalid || p.Message != tt.want:
				t.Errorf("problem = %+v, want %s: %q", p, ReasonTLSSecretInvalid, tt.want)
			}
		})
	}
}
