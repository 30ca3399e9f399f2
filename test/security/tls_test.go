package security

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strconv"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// tlsIssued bounds cert-manager issuing a certificate (about a second).
const tlsIssued = 60 * time.Second

// tlsClusterIssuer is a CA ClusterIssuer such as clusters have (the chart
// itself installed one under this name, as every server's default issuer):
// anyone allowed to create a Certificate in any namespace can use it.
const tlsClusterIssuer = "guestbackup-server-ca"

// tlsChartController is the controller as the chart configures it with
// cert-manager enabled (--cert-manager-ca), otherwise as local runs it.
func tlsChartController() *controller.Options {
	o := local.ControllerOptions()
	o.CertManagerCA = true
	return &o
}

// tlsCAHierarchy creates, through c, a selfSigned issuer, a CA Certificate
// it signs and a CA issuer of that CA, named name (Issuers in namespace,
// or ClusterIssuers when namespace is ""; the CA's Secret in
// secretNamespace), and waits until
// the CA issuer is ready; it returns the CA.
func tlsCAHierarchy(c client.Client, namespace, secretNamespace, name string) *x509.Certificate {
	GinkgoHelper()
	kind := certmanagerv1.IssuerKind
	if namespace == "" {
		kind = certmanagerv1.ClusterIssuerKind
	}
	issuer := func(n string, cfg certmanagerv1.IssuerConfig) client.Object {
		spec := certmanagerv1.IssuerSpec{IssuerConfig: cfg}
		if namespace == "" {
			return &certmanagerv1.ClusterIssuer{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: spec}
		}
		return &certmanagerv1.Issuer{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: namespace}, Spec: spec}
	}
	Expect(c.Create(ctx, issuer(name+"-selfsigned", certmanagerv1.IssuerConfig{SelfSigned: &certmanagerv1.SelfSignedIssuer{}}))).To(Succeed())
	Expect(c.Create(ctx, &certmanagerv1.Certificate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: secretNamespace},
		Spec: certmanagerv1.CertificateSpec{
			IsCA: true, CommonName: name, SecretName: name,
			PrivateKey: &certmanagerv1.CertificatePrivateKey{Algorithm: certmanagerv1.ECDSAKeyAlgorithm, Size: 256},
			IssuerRef:  cmmeta.ObjectReference{Name: name + "-selfsigned", Kind: kind, Group: "cert-manager.io"},
		},
	})).To(Succeed())
	Expect(c.Create(ctx, issuer(name, certmanagerv1.IssuerConfig{CA: &certmanagerv1.CAIssuer{SecretName: name}}))).To(Succeed())
	s := tlsWaitSecret(c, secretNamespace, name)
	certs, err := certutil.ParseCertsPEM(s.Data[corev1.TLSCertKey])
	Expect(err).NotTo(HaveOccurred())
	return certs[0]
}

// tlsWaitSecret waits until c can read the Secret cert-manager issues.
func tlsWaitSecret(c client.Client, namespace, name string) *corev1.Secret {
	GinkgoHelper()
	s := &corev1.Secret{}
	Eventually(func() ([]byte, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, s)
		return s.Data[corev1.TLSCertKey], err
	}).WithTimeout(tlsIssued).WithPolling(200 * time.Millisecond).ShouldNot(BeEmpty())
	return s
}

// tlsMint has the tenant request, in her namespace, a serving certificate
// for every name of the BSLS's server (and 127.0.0.1, where the test
// reaches it) from the issuer she names, and returns its Secret.
func tlsMint(t *Tenant, name string, issuer cmmeta.ObjectReference, bsls *v1alpha1.BackupStorageLocationServer) *corev1.Secret {
	GinkgoHelper()
	dnsNames, _ := kopiaserver.ServingNames(bsls)
	Expect(t.Client.Create(ctx, &certmanagerv1.Certificate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.Namespace},
		Spec: certmanagerv1.CertificateSpec{
			SecretName: name, CommonName: dnsNames[0], DNSNames: dnsNames, IPAddresses: []string{"127.0.0.1"},
			Usages:     []certmanagerv1.KeyUsage{certmanagerv1.UsageServerAuth, certmanagerv1.UsageDigitalSignature},
			PrivateKey: &certmanagerv1.CertificatePrivateKey{Algorithm: certmanagerv1.ECDSAKeyAlgorithm, Size: 256},
			IssuerRef:  issuer,
		},
	})).To(Succeed(), "the tenant may request certificates in her namespace")
	return tlsWaitSecret(t.Client, t.Namespace, name)
}

// tlsServeMinted runs a real Kopia server on a repository of its own that
// presents the minted Secret's chain (tls.crt, then ca.crt), followed by
// alsoPresent (PEM): what the tenant runs wherever guests' connections can
// be made to land. It returns the server's URL; the spec's cleanup stops it.
func tlsServeMinted(s *corev1.Secret, alsoPresent []byte) string {
	GinkgoHelper()
	tools := testbed.MustTools(GinkgoT())
	dir := GinkgoT().TempDir()
	chain, err := pki.Chain(s.Data[corev1.TLSCertKey], s.Data["ca.crt"])
	Expect(err).NotTo(HaveOccurred())
	chain = append(chain, alsoPresent...)
	certFile, keyFile, config := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "repository.config")
	Expect(os.WriteFile(certFile, chain, 0o600)).To(Succeed())
	Expect(os.WriteFile(keyFile, s.Data[corev1.TLSPrivateKeyKey], 0o600)).To(Succeed())
	env := []string{"KOPIA_CHECK_FOR_UPDATES=false", "KOPIA_PASSWORD=" + testbed.RandomPassword(), "KOPIA_SERVER_CONTROL_PASSWORD=" + testbed.RandomPassword()}
	out, err := testbed.Run(ctx, time.Minute, dir, env, tools.Kopia, "repository", "create", "filesystem", "--config-file="+config, "--path="+filepath.Join(dir, "repository"))
	Expect(err).NotTo(HaveOccurred(), "kopia repository create: %s", out)
	port, err := testbed.FreePort()
	Expect(err).NotTo(HaveOccurred())
	addr := "127.0.0.1:" + strconv.Itoa(port)
	testbed.StartProcess(GinkgoT(), testbed.ProcessSpec{
		Name: "mallory-kopia-server-" + strconv.Itoa(port), Path: tools.Kopia, Dir: filepath.Join(dir, "server"), Env: env,
		Args: []string{"server", "start", "--config-file=" + config, "--address=" + addr,
			"--tls-cert-file=" + certFile, "--tls-key-file=" + keyFile, "--server-control-username=control", "--no-ui"},
	})
	cas, err := certutil.ParseCertsPEM(s.Data["ca.crt"])
	Expect(err).NotTo(HaveOccurred())
	roots := x509.NewCertPool()
	roots.AddCert(cas[0])
	Eventually(func() error {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
		if err != nil {
			return err
		}
		return conn.Close()
	}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(Succeed(), "the tenant's Kopia server serves her certificate")
	return "https://" + addr
}

// A tenant who may create cert-manager Certificates in her namespace gets
// a certificate for the BSLS server's names from any issuer she can use and
// serves it: a guest whose connection lands on her server must refuse it,
// because it trusts the BSLS's own CA only, which signs nothing else, and
// verifies that the CA signed the server's certificate, not merely that
// the server sends it.
var _ = Describe("A tenant serving a certificate she minted for a BSLS's server, with cert-manager", Ordered, func() {
	const (
		backupNS = "tls-backup"
		otherNS  = "tls-other"
		tenantNS = "tls-team-a"
		bslsName = "main"
	)
	var (
		s        Server
		mallory  *Tenant
		clusterC *x509.Certificate
		username string
		password string
	)
	refused := func(url string) {
		GinkgoHelper()
		out, err := testbed.NewKopiaClient(GinkgoT()).Connect(ctx, url, s.CA, username, password)
		Expect(err).To(HaveOccurred(), "a guest trusting the BSLS's CA connected to the tenant's server: %s", out)
		Expect(out).To(ContainSubstring("certificate signed by unknown authority"), "refused for its certificate")
		// Her server knows no user: a refusal of the password would mean
		// the guest sent it.
		Expect(out).NotTo(Or(ContainSubstring("access denied"), ContainSubstring("Unauthenticated")), "the guest sent its credentials to her server")
	}

	BeforeAll(func() {
		// The shared platform runs without cert-manager; this one runs
		// guestbackup as the chart does with cert-manager, and cert-manager's
		// own controllers. The scaffold's helpers use the package's
		// platform, so it stands in for it until this container ends
		// (specs run one at a time).
		cm := local.Start(GinkgoT(), local.Options{Logger: GinkgoLogr, Controller: tlsChartController()})
		testbed.StartCertManager(GinkgoT(), cm.API, testbed.CertManagerOptions{})
		shared := platform
		platform = cm
		DeferCleanup(func() { platform = shared })

		clusterC = tlsCAHierarchy(platform.API.Client, "", "cert-manager", tlsClusterIssuer)
		newNamespace(backupNS, nil)
		newNamespace(otherNS, nil)
		newNamespace(tenantNS, map[string]string{"tls-backup": "allowed"})
		mallory = newTenant("mallory", tenantNS)
		b := bslsFor(backupNS, bslsName, map[string]string{"tls-backup": "allowed"}, false)
		s = serveBSLS(b)

		By("a guest of the tenant's namespace, whose connections she wants")
		createVM(mallory.Client, tenantNS, "web", backupNS+"/"+bslsName)
		username, password = waitProvisioned(s, tenantNS, "web")
	})

	It("pins a CA of the BSLS's own: neither a cluster-wide issuer's nor another BSLS's", func() {
		Expect(s.Pin).NotTo(Equal(pki.Fingerprint(clusterC)))
		other := bslsFor(otherNS, bslsName, nil, false)
		Expect(platform.API.Client.Create(ctx, other)).To(Succeed())
		Eventually(func() (string, error) {
			err := platform.API.Client.Get(ctx, client.ObjectKeyFromObject(other), other)
			return other.Status.TLSFingerprint, err
		}).WithTimeout(tlsIssued).Should(HaveLen(64))
		Expect(other.Status.TLSFingerprint).NotTo(Equal(s.Pin), "two BSLSs, two CAs")
	})

	It("refuses her server when she minted from a CA ClusterIssuer of the cluster", func() {
		minted := tlsMint(mallory, "from-cluster-ca", cmmeta.ObjectReference{Name: tlsClusterIssuer, Kind: certmanagerv1.ClusterIssuerKind, Group: "cert-manager.io"}, s.BSLS)
		refused(tlsServeMinted(minted, nil))
	})

	It("refuses her server when she minted from a CA Issuer of her own", func() {
		tlsCAHierarchy(mallory.Client, tenantNS, tenantNS, "mallory-ca")
		minted := tlsMint(mallory, "from-own-ca", cmmeta.ObjectReference{Name: "mallory-ca", Kind: certmanagerv1.IssuerKind, Group: "cert-manager.io"}, s.BSLS)
		refused(tlsServeMinted(minted, nil))
	})

	It("refuses her server when it sends the BSLS's own CA after a certificate she minted", func() {
		// The CA's certificate is public: the genuine server sends it in
		// every handshake, and the BSLS's status shows it. A fingerprint
		// pin of it is satisfied by any chain that carries it.
		minted := tlsMint(mallory, "carrying-the-bsls-ca", cmmeta.ObjectReference{Name: "mallory-ca", Kind: certmanagerv1.IssuerKind, Group: "cert-manager.io"}, s.BSLS)
		refused(tlsServeMinted(minted, s.CA))
	})

	It("still lets the guest in to the genuine server with the same CA", func() {
		_, err := loginAs(s, username, password)
		Expect(err).NotTo(HaveOccurred())
	})
})
