package kopiaserver_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"strconv"
	"time"

	apiutil "github.com/cert-manager/cert-manager/pkg/api/util"
	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// issued bounds how long cert-manager may take to issue or re-issue a
// certificate. It issues in about a second; the first custom resource write
// to a fresh API server alone takes about two.
const issued = 30 * time.Second

var _ = Describe("A BSLS with certificates from cert-manager", Ordered, func() {
	const (
		ns   = "secured"
		name = "pinned"
		// The CA hierarchy an admin builds: a selfSigned ClusterIssuer signs
		// a CA Certificate, whose Secret backs the CA ClusterIssuer that
		// signs the servers.
		selfSignedIssuer = "selfsigned"
		caIssuer         = "guestbackup-ca"
		caCertificate    = "guestbackup-ca"
	)
	var (
		ctx      context.Context
		api      *testbed.APIServer
		cm       *testbed.CertManager
		bsls     *v1alpha1.BackupStorageLocationServer
		binaries map[string]string
		claimDir string
		// pin is status.tlsFingerprint as first reported: what guests keep.
		pin string
		// clk is the controller's clock.
		clk = &pausableClock{}
		// guestPassword is the password of guest vm@secured.
		guestPassword = testbed.RandomPassword()
	)

	get := func(namespace, name string, obj client.Object) func() error {
		return func() error {
			return api.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, obj)
		}
	}
	current := func() *v1alpha1.BackupStorageLocationServer {
		GinkgoHelper()
		b := &v1alpha1.BackupStorageLocationServer{}
		Expect(get(ns, name, b)()).To(Succeed())
		return b
	}
	certificateReady := func() *metav1.Condition {
		b := &v1alpha1.BackupStorageLocationServer{}
		if err := get(ns, name, b)(); err != nil {
			return nil
		}
		return meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionCertificateReady)
	}
	// serving is the server Secret's content: the leaf (first of tls.crt)
	// and the CAs of ca.crt.
	type serving struct {
		secret *corev1.Secret
		leaf   *x509.Certificate
		chain  []*x509.Certificate
		cas    []*x509.Certificate
	}
	servingSecret := func() serving {
		GinkgoHelper()
		s := &corev1.Secret{}
		Expect(get(ns, kopiaserver.TLSSecretName(bsls), s)()).To(Succeed())
		chain, err := certutil.ParseCertsPEM(s.Data[corev1.TLSCertKey])
		Expect(err).NotTo(HaveOccurred(), "tls.crt of Secret %s", s.Name)
		cas, err := certutil.ParseCertsPEM(s.Data["ca.crt"])
		Expect(err).NotTo(HaveOccurred(), "ca.crt of Secret %s", s.Name)
		return serving{secret: s, leaf: chain[0], chain: chain, cas: cas}
	}
	leafSerial := func() *big.Int {
		s := &corev1.Secret{}
		if err := get(ns, kopiaserver.TLSSecretName(bsls), s)(); err != nil {
			return nil
		}
		certs, err := certutil.ParseCertsPEM(s.Data[corev1.TLSCertKey])
		if err != nil {
			return nil
		}
		return certs[0].SerialNumber
	}
	tlsChecksum := func() string {
		d := &appsv1.Deployment{}
		if err := get(ns, kopiaserver.DeploymentName(bsls), d)(); err != nil {
			return ""
		}
		return d.Spec.Template.Annotations[kopiaserver.AnnotationTLSChecksum]
	}
	serviceName := func() string { return kopiaserver.ServiceName(bsls) + "." + ns + ".svc" }
	// runServer runs the server pod from the Deployment as it is now, with
	// the Secrets as they are now, until the end of the current spec.
	runServer := func() *testbed.Pod {
		GinkgoHelper()
		d := &appsv1.Deployment{}
		Expect(get(ns, kopiaserver.DeploymentName(bsls), d)()).To(Succeed())
		pod := testbed.RunPod(GinkgoT(), testbed.PodOptions{
			Namespace: ns,
			Spec:      d.Spec.Template.Spec,
			Binaries:  binaries,
			Claims:    map[string]string{kopiaserver.ClaimName(bsls): claimDir},
			API:       api,
		})
		Expect(pod.WaitReady(2 * time.Minute)).To(Succeed())
		return pod
	}
	// connect runs a guest's `kopia repository connect server`, trusting
	// only a server whose chain holds a certificate with fingerprint pin.
	connect := func(pod *testbed.Pod, pin string) func() error {
		return func() error {
			url := "https://" + pod.Addr(v1alpha1.DefaultServerPort)
			out, err := testbed.NewKopiaClient(GinkgoT()).ConnectPinned(ctx, url, pin, "vm@"+ns, guestPassword)
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return nil
		}
	}
	// renew asks cert-manager to issue Certificate name again, as `cmctl
	// renew` does: the Issuing condition.
	renew := func(name string) {
		GinkgoHelper()
		Eventually(func() error {
			crt := &certmanagerv1.Certificate{}
			if err := get(ns, name, crt)(); err != nil {
				return err
			}
			apiutil.SetCertificateCondition(crt, crt.Generation, certmanagerv1.CertificateConditionIssuing,
				cmmeta.ConditionTrue, "ManuallyTriggered", "Re-issuance triggered by the guestbackup test")
			return api.Client.Status().Update(ctx, crt)
		}).WithTimeout(10 * time.Second).Should(Succeed())
	}
	// presented is the leaf a server presents to a client that verifies it
	// as a guest resolving the Service would: against ca.crt, for the
	// Service's name.
	presented := func(pod *testbed.Pod, cas []*x509.Certificate) (*x509.Certificate, error) {
		roots := x509.NewCertPool()
		for _, c := range cas {
			roots.AddCert(c)
		}
		dialer := &tls.Dialer{Config: &tls.Config{RootCAs: roots, ServerName: serviceName(), MinVersion: tls.VersionTLS12}}
		dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := dialer.DialContext(dialCtx, "tcp", pod.Addr(v1alpha1.DefaultServerPort))
		if err != nil {
			return nil, fmt.Errorf("TLS handshake with the server: %w", err)
		}
		defer conn.Close()
		return conn.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
	}

	BeforeAll(func() {
		ctx = context.Background()
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
		for _, n := range []string{ns, controllerNamespace} {
			Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})).To(Succeed())
		}
		cm = testbed.StartCertManager(GinkgoT(), api, testbed.CertManagerOptions{})
		binaries = serverBinaries(GinkgoT())
		claimDir = GinkgoT().TempDir()
		// As the chart runs it with cert-manager: the BSLS above names its
		// issuer, those below get a CA of their own through cert-manager.
		startController(api, func(r *kopiaserver.Reconciler) { r.CertManagerCA, r.Clock = true, clk })
	})

	It("has cert-manager issue a CA from a selfSigned ClusterIssuer and serve it as a CA ClusterIssuer", func() {
		Expect(api.Client.Create(ctx, &certmanagerv1.ClusterIssuer{
			ObjectMeta: metav1.ObjectMeta{Name: selfSignedIssuer},
			Spec:       certmanagerv1.IssuerSpec{IssuerConfig: certmanagerv1.IssuerConfig{SelfSigned: &certmanagerv1.SelfSignedIssuer{}}},
		})).To(Succeed())
		// A ClusterIssuer's CA Secret lives in cert-manager's cluster
		// resource namespace.
		Expect(api.Client.Create(ctx, &certmanagerv1.Certificate{
			ObjectMeta: metav1.ObjectMeta{Name: caCertificate, Namespace: cm.ClusterResourceNamespace},
			Spec: certmanagerv1.CertificateSpec{
				IsCA:       true,
				CommonName: "guestbackup test CA",
				SecretName: caCertificate,
				PrivateKey: &certmanagerv1.CertificatePrivateKey{Algorithm: certmanagerv1.ECDSAKeyAlgorithm, Size: 256},
				IssuerRef:  cmmeta.ObjectReference{Name: selfSignedIssuer, Kind: certmanagerv1.ClusterIssuerKind, Group: "cert-manager.io"},
			},
		})).To(Succeed())
		Expect(api.Client.Create(ctx, &certmanagerv1.ClusterIssuer{
			ObjectMeta: metav1.ObjectMeta{Name: caIssuer},
			Spec:       certmanagerv1.IssuerSpec{IssuerConfig: certmanagerv1.IssuerConfig{CA: &certmanagerv1.CAIssuer{SecretName: caCertificate}}},
		})).To(Succeed())

		issuerReady := func() []certmanagerv1.IssuerCondition {
			ci := &certmanagerv1.ClusterIssuer{}
			if err := get("", caIssuer, ci)(); err != nil {
				return nil
			}
			return ci.Status.Conditions
		}
		Eventually(issuerReady).WithTimeout(issued).WithPolling(100 * time.Millisecond).Should(ContainElement(And(
			HaveField("Type", certmanagerv1.IssuerConditionReady), HaveField("Status", cmmeta.ConditionTrue))))
		ca := &corev1.Secret{}
		Expect(get(cm.ClusterResourceNamespace, caCertificate, ca)()).To(Succeed())
		certs, err := certutil.ParseCertsPEM(ca.Data[corev1.TLSCertKey])
		Expect(err).NotTo(HaveOccurred())
		Expect(certs[0].IsCA).To(BeTrue())
		Expect(certs[0].Subject.CommonName).To(Equal("guestbackup test CA"))
	})

	It("reports CertificateReady with the pin of cert-manager's CA once the server's certificate is issued", func() {
		bsls = &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
				TLS:     v1alpha1.TLSSpec{IssuerRef: &v1alpha1.IssuerReference{Name: caIssuer, Kind: "ClusterIssuer"}},
			},
		}
		Expect(api.Client.Create(ctx, bsls)).To(Succeed())
		Eventually(certificateReady).WithTimeout(issued).WithPolling(100 * time.Millisecond).Should(And(
			Not(BeNil()),
			HaveField("Status", metav1.ConditionTrue),
			HaveField("Reason", kopiaserver.ReasonCertificateIssued),
			HaveField("Message", ContainSubstring("cert-manager ClusterIssuer "+caIssuer)),
		))

		By("pinning the CA cert-manager wrote in ca.crt, which is the CA Certificate's own")
		s := servingSecret()
		Expect(s.cas).To(HaveLen(1))
		pin = current().Status.TLSFingerprint
		Expect(pin).To(Equal(pki.Fingerprint(s.cas[0])))
		caSecret := &corev1.Secret{}
		Expect(get(cm.ClusterResourceNamespace, caCertificate, caSecret)()).To(Succeed())
		Expect(s.secret.Data["ca.crt"]).To(Equal(caSecret.Data[corev1.TLSCertKey]))

		By("holding a leaf that verifies against that CA for the Service's names, with its key")
		Expect(s.leaf.IsCA).To(BeFalse())
		// cert-manager leaves a self-signed CA out of tls.crt: a guest's
		// pin matches only because the server presents ca.crt after it.
		Expect(s.chain).To(HaveLen(1), "tls.crt holds the leaf alone")
		Expect(s.leaf.DNSNames).To(ContainElements(serviceName(), serviceName()+".cluster.local"))
		roots, intermediates := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(s.cas[0])
		for _, c := range s.chain[1:] {
			intermediates.AddCert(c)
		}
		_, err := s.leaf.Verify(x509.VerifyOptions{
			DNSName: serviceName(), Roots: roots, Intermediates: intermediates,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		Expect(err).NotTo(HaveOccurred())
		_, err = tls.X509KeyPair(s.secret.Data[corev1.TLSCertKey], s.secret.Data[corev1.TLSPrivateKeyKey])
		Expect(err).NotTo(HaveOccurred(), "tls.key matches tls.crt")

		By("starting the server with it")
		Eventually(tlsChecksum).WithTimeout(reconciled).ShouldNot(BeEmpty())
	})

	It("lets a real Kopia client pinned to status.tlsFingerprint connect to the server run with that Secret", func() {
		Expect(createCredential(ctx, api, credentialSecret("vm", ns, ns, name, guestPassword, "1"))).To(Succeed())
		pod := runServer()
		Eventually(connect(pod, pin)).WithTimeout(provisioned).Should(Succeed())
		other, err := pki.NewCA("not the server's CA", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		Expect(connect(pod, pki.Fingerprint(other.Cert))()).To(MatchError(ContainSubstring("can't find certificate matching SHA256 fingerprint")))
	})

	It("rolls the server onto a renewed leaf under the same CA, so the guests' pin still holds", func() {
		before := servingSecret()
		checksum := tlsChecksum()
		Expect(checksum).NotTo(BeEmpty())

		By("asking cert-manager to re-issue, as `cmctl renew` does: the Issuing condition")
		renew(kopiaserver.CertificateName(bsls))

		Eventually(leafSerial).WithTimeout(issued).WithPolling(100 * time.Millisecond).
			Should(And(Not(BeNil()), Not(Equal(before.leaf.SerialNumber))))
		after := servingSecret()
		Expect(after.secret.Data[corev1.TLSPrivateKeyKey]).NotTo(Equal(before.secret.Data[corev1.TLSPrivateKeyKey]),
			"rotationPolicy Always: a new key with every certificate")
		Expect(after.secret.Data["ca.crt"]).To(Equal(before.secret.Data["ca.crt"]))

		By("changing the pod template's checksum, which makes the Deployment roll")
		Eventually(tlsChecksum).WithTimeout(reconciled).ShouldNot(Or(BeEmpty(), Equal(checksum)))
		Expect(current().Status.TLSFingerprint).To(Equal(pin))
		Expect(certificateReady()).To(HaveField("Status", metav1.ConditionTrue))

		By("serving the new leaf from the rolled server to a guest that kept its pin")
		pod := runServer()
		Eventually(connect(pod, pin)).WithTimeout(provisioned).Should(Succeed())
		leaf, err := presented(pod, after.cas)
		Expect(err).NotTo(HaveOccurred())
		Expect(leaf.SerialNumber).To(Equal(after.leaf.SerialNumber))
	})

	It("re-issues for a name added through spec.clientURL, under the same pin", func() {
		const host = "backup.example.test"
		before := leafSerial()
		checksum := tlsChecksum()
		Eventually(func() error {
			b := current()
			b.Spec.ClientURL = "https://" + host + ":51515"
			return api.Client.Update(ctx, b)
		}).WithTimeout(10 * time.Second).Should(Succeed())

		Eventually(func() []string {
			crt := &certmanagerv1.Certificate{}
			if err := get(ns, kopiaserver.CertificateName(bsls), crt)(); err != nil {
				return nil
			}
			return crt.Spec.DNSNames
		}).WithTimeout(reconciled).Should(ContainElement(host))
		Eventually(leafSerial).WithTimeout(issued).WithPolling(100 * time.Millisecond).
			Should(And(Not(BeNil()), Not(Equal(before))))
		Expect(servingSecret().leaf.DNSNames).To(ContainElements(host, serviceName()))
		Eventually(tlsChecksum).WithTimeout(reconciled).ShouldNot(Or(BeEmpty(), Equal(checksum)))
		Eventually(func() string { return current().Status.Endpoint }).WithTimeout(reconciled).Should(Equal("https://" + host + ":51515"))
		Expect(current().Status.TLSFingerprint).To(Equal(pin))
	})

	Describe("BSLSs that name no issuer", Ordered, func() {
		var own [2]*v1alpha1.BackupStorageLocationServer
		ownPin := func(b *v1alpha1.BackupStorageLocationServer) func() (string, error) {
			return func() (string, error) {
				cur := &v1alpha1.BackupStorageLocationServer{}
				err := get(b.Namespace, b.Name, cur)()
				return cur.Status.TLSFingerprint, err
			}
		}
		serial := func(b *v1alpha1.BackupStorageLocationServer) func() *big.Int {
			return func() *big.Int {
				s := &corev1.Secret{}
				if err := get(b.Namespace, kopiaserver.TLSSecretName(b), s)(); err != nil {
					return nil
				}
				certs, err := certutil.ParseCertsPEM(s.Data[corev1.TLSCertKey])
				if err != nil {
					return nil
				}
				return certs[0].SerialNumber
			}
		}

		It("get a CA each through cert-manager: two BSLSs, two pins, neither a shared issuer's", func() {
			for i, n := range []string{"own-a", "own-b"} {
				own[i] = &v1alpha1.BackupStorageLocationServer{
					ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ns},
					Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
				}
				Expect(api.Client.Create(ctx, own[i])).To(Succeed())
			}
			for _, b := range own {
				Eventually(ownPin(b)).WithTimeout(issued).WithPolling(100 * time.Millisecond).Should(HaveLen(64))
				cur := &v1alpha1.BackupStorageLocationServer{}
				Expect(get(ns, b.Name, cur)()).To(Succeed())
				Expect(meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionCertificateReady)).To(And(
					HaveField("Status", metav1.ConditionTrue),
					HaveField("Message", ContainSubstring("its own CA in Secret "+kopiaserver.CASecretName(b)+", through cert-manager Issuer "+kopiaserver.CAIssuerName(b))),
				))

				By("pinning the CA in <bsls>-ca, kept without an owner like the controller's own CA")
				ca := &corev1.Secret{}
				Expect(get(ns, kopiaserver.CASecretName(b), ca)()).To(Succeed())
				certs, err := certutil.ParseCertsPEM(ca.Data[corev1.TLSCertKey])
				Expect(err).NotTo(HaveOccurred())
				Expect(certs[0].IsCA).To(BeTrue())
				Expect(cur.Status.TLSFingerprint).To(Equal(pki.Fingerprint(certs[0])))
				Expect(ca.Annotations).To(HaveKey(kopiaserver.AnnotationKeep))
				Expect(ca.OwnerReferences).To(BeEmpty())
				caCert := &certmanagerv1.Certificate{}
				Expect(get(ns, kopiaserver.CACertificateName(b), caCert)()).To(Succeed())
				Expect(caCert.OwnerReferences).To(BeEmpty(), "deleting the BSLS must not take its CA")
				Expect(caCert.Spec.IsCA).To(BeTrue())
				_, err = pki.ParseCA(ca.Data[corev1.TLSCertKey], ca.Data[corev1.TLSPrivateKeyKey])
				Expect(err).NotTo(HaveOccurred(), "the controller can read cert-manager's CA: switching keeps the pin")
				issuer := &certmanagerv1.Issuer{}
				Expect(get(ns, kopiaserver.CAIssuerName(b), issuer)()).To(Succeed())
				Expect(issuer.Spec.CA).To(HaveField("SecretName", kopiaserver.CASecretName(b)))
			}
			Expect(own[0].Name).NotTo(Equal(own[1].Name))
			a, _ := ownPin(own[0])()
			b, _ := ownPin(own[1])()
			Expect(a).NotTo(Equal(b), "two BSLSs, two CAs")
			Expect(a).NotTo(Equal(pin), "not the admin's ClusterIssuer's CA")
			Expect(b).NotTo(Equal(pin))
		})

		It("keep their pin when cert-manager renews the leaf", func() {
			b := own[0]
			before := serial(b)()
			Expect(before).NotTo(BeNil())
			p, _ := ownPin(b)()
			checksum := func() string {
				d := &appsv1.Deployment{}
				if err := get(ns, kopiaserver.DeploymentName(b), d)(); err != nil {
					return ""
				}
				return d.Spec.Template.Annotations[kopiaserver.AnnotationTLSChecksum]
			}
			Eventually(checksum).WithTimeout(reconciled).ShouldNot(BeEmpty())
			rolled := checksum()
			renew(kopiaserver.CertificateName(b))
			Eventually(serial(b)).WithTimeout(issued).WithPolling(100 * time.Millisecond).Should(And(Not(BeNil()), Not(Equal(before))))
			By("rolling the server onto the new leaf, under the same pin")
			Eventually(checksum).WithTimeout(reconciled).ShouldNot(Equal(rolled))
			Expect(ownPin(b)()).To(Equal(p))
		})

		It("keep their CA when its Secret, which cert-manager writes, is deleted, putting it back over the CA cert-manager issues again", func() {
			b := own[1]
			ca := &corev1.Secret{}
			Eventually(func(g Gomega) {
				g.Expect(get(ns, kopiaserver.CASecretName(b), ca)()).To(Succeed())
				g.Expect(ca.Finalizers).To(ContainElement(kopiaserver.FinalizerCAGuard))
			}).WithTimeout(reconciled).Should(Succeed())
			before := ca.DeepCopy()
			p, _ := ownPin(b)()
			caCerts, err := certutil.ParseCertsPEM(before.Data[corev1.TLSCertKey])
			Expect(err).NotTo(HaveOccurred())
			caRevision := func() (int, bool) {
				crt := &certmanagerv1.Certificate{}
				if get(ns, kopiaserver.CACertificateName(b), crt)() != nil || crt.Status.Revision == nil {
					return 0, false
				}
				return *crt.Status.Revision, apiutil.CertificateHasCondition(crt, certmanagerv1.CertificateCondition{
					Type: certmanagerv1.CertificateConditionIssuing, Status: cmmeta.ConditionTrue})
			}
			revision, _ := caRevision()
			sameCA := func(g Gomega, s *corev1.Secret) {
				g.Expect(s.DeletionTimestamp).To(BeNil())
				g.Expect(s.Data[corev1.TLSCertKey]).To(Equal(before.Data[corev1.TLSCertKey]), "the same CA certificate")
				g.Expect(s.Data[corev1.TLSPrivateKeyKey]).To(Equal(before.Data[corev1.TLSPrivateKeyKey]), "the same CA key")
			}

			By("holding the controller's clock: its hold over what cert-manager writes lasts until the spec moves it")
			clk.Pause()
			DeferCleanup(clk.Resume)
			Expect(api.Client.Delete(ctx, ca)).To(Succeed())
			// cert-manager's Secret is outside the controller's cache, so
			// the controller finds it terminating at its next pass (at the
			// latest kopiaserver.RecheckSecrets later; the Secret stays
			// usable meanwhile). A namespace label change brings that pass
			// now.
			nsObj := &corev1.Namespace{}
			Expect(get("", ns, nsObj)()).To(Succeed())
			nsObj.Labels = map[string]string{"nudge": "ca-deleted"}
			Expect(api.Client.Update(ctx, nsObj)).To(Succeed())
			Eventually(func(g Gomega) {
				now := &corev1.Secret{}
				g.Expect(get(ns, kopiaserver.CASecretName(b), now)()).To(Succeed())
				sameCA(g, now)
				g.Expect(now.Annotations).To(HaveKeyWithValue("cert-manager.io/certificate-name", kopiaserver.CACertificateName(b)))
				g.Expect(get(ns, kopiaserver.CARescueSecretName(b), &corev1.Secret{})()).To(Succeed(), "the copy is kept while cert-manager may write")
			}).WithTimeout(reconciled).Should(Succeed())

			By("cert-manager issuing the CA again meanwhile, as `cmctl renew` makes it, and the controller putting the guests' CA back over it")
			renew(kopiaserver.CACertificateName(b))
			// Settled is cert-manager's own rule: done issuing, and the
			// CertificateRequest of the current revision is for the key
			// in the Secret (else it issues again, "SecretMismatch").
			Eventually(func(g Gomega) {
				now, issuing := caRevision()
				g.Expect(now).To(BeNumerically(">", revision), "cert-manager issued the CA again")
				g.Expect(issuing).To(BeFalse())
				s := &corev1.Secret{}
				g.Expect(get(ns, kopiaserver.CASecretName(b), s)()).To(Succeed())
				sameCA(g, s)
				g.Expect(get(ns, kopiaserver.CARescueSecretName(b), &corev1.Secret{})()).To(Succeed())
				crs := &certmanagerv1.CertificateRequestList{}
				g.Expect(api.Client.List(ctx, crs, client.InNamespace(ns))).To(Succeed())
				var current *certmanagerv1.CertificateRequest
				for i, cr := range crs.Items {
					if cr.Annotations[certmanagerv1.CertificateNameKey] == kopiaserver.CACertificateName(b) &&
						cr.Annotations[certmanagerv1.CertificateRequestRevisionAnnotationKey] == strconv.Itoa(now) {
						current = &crs.Items[i]
					}
				}
				g.Expect(current).NotTo(BeNil(), "the CertificateRequest of revision %d", now)
				block, _ := pem.Decode(current.Spec.Request)
				g.Expect(block).NotTo(BeNil())
				csr, err := x509.ParseCertificateRequest(block.Bytes)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(csr.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(caCerts[0].PublicKey)).To(BeTrue(), "issued for the guests' CA key")
			}).WithTimeout(issued).Should(Succeed())
			Expect(bslsEvents(ctx, api, ns, b.Name)()).NotTo(ContainElement(HavePrefix("Warning "+kopiaserver.ReasonCASecretRestored+": ")), "not done while cert-manager may write")

			By("moving the clock past the hold: the restore is done, and said")
			// The controller may see cert-manager's last revision only
			// now, and let it settle from then on: each look moves the
			// clock past one more settling (far from the hold's bound).
			Eventually(func() []string {
				clk.Step(16 * time.Second)
				return bslsEvents(ctx, api, ns, b.Name)()
			}).WithTimeout(reconciled).WithPolling(2 * time.Second).Should(ContainElement(And(
				HavePrefix("Warning "+kopiaserver.ReasonCASecretRestored+": Secret "+ns+"/"+kopiaserver.CASecretName(b)+" was deleted"),
				Not(ContainSubstring("was still issuing")))))
			Expect(get(ns, kopiaserver.CARescueSecretName(b), &corev1.Secret{})()).NotTo(Succeed(), "no copy of the key is left behind")
			now := &corev1.Secret{}
			Expect(get(ns, kopiaserver.CASecretName(b), now)()).To(Succeed())
			sameCA(Default, now)

			By("the server's leaf under it, and the guests' pin")
			Eventually(func(g Gomega) {
				leaf := &corev1.Secret{}
				g.Expect(get(ns, kopiaserver.TLSSecretName(b), leaf)()).To(Succeed())
				chain, err := certutil.ParseCertsPEM(leaf.Data[corev1.TLSCertKey])
				g.Expect(err).NotTo(HaveOccurred())
				roots := x509.NewCertPool()
				roots.AddCert(caCerts[0])
				_, err = chain[0].Verify(x509.VerifyOptions{DNSName: kopiaserver.ServiceName(b) + "." + ns + ".svc", Roots: roots})
				g.Expect(err).NotTo(HaveOccurred(), "the leaf chains to the CA guests trust")
			}).WithTimeout(issued).Should(Succeed())
			Expect(ownPin(b)()).To(Equal(p))
			Expect(bslsEvents(ctx, api, ns, b.Name)()).NotTo(ContainElement(HavePrefix("Warning " + kopiaserver.ReasonCAChanged + ": ")))
		})
	})
})
