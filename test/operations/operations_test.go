package operations

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/promexpr"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// monitoringFiles is where the chart keeps its dashboard and alerts.
var monitoringFiles = filepath.Join("..", "..", "charts", "guestbackup", "files", "monitoring")

var _ = Describe("An admin over the years", Ordered, func() {
	var (
		first   *cluster
		port    int
		bsls    *v1alpha1.BackupStorageLocationServer
		pod     *testbed.Pod
		claim   string
		guest   *testbed.KopiaClient
		files   guestFiles
		content = []byte("what the owner must never lose\n")
		source  string
		snap    string
		// carried are the objects the admin kept of the first cluster,
		// as docs/disaster-recovery.md lists them.
		carried struct {
			repositoryPassword, ca, vmSecret *corev1.Secret
			vm                               *kubevirtv1.VirtualMachine
		}
	)

	// oldBootstrapRestores: the guest, still connected with the kopia
	// configuration its first bootstrap made, and again with a fresh
	// connection from exactly that bootstrap's files (as at its next
	// boot), lists and restores its snapshot.
	oldBootstrapRestores := func() {
		GinkgoHelper()
		By("the guest, still connected with its old bootstrap, lists and restores its snapshot")
		Eventually(func() error {
			_, err := guest.Run(ctx, "snapshot", "list", "--json", source)
			return err
		}).WithTimeout(provisionTimeout).WithPolling(2 * time.Second).Should(Succeed())
		restoreAndCompare(guest, snap, content)

		By("a fresh connection with exactly the files its old bootstrap installed, as at its next boot, logs in too")
		again, err := connect(files)
		Expect(err).NotTo(HaveOccurred())
		restoreAndCompare(again, snap, content)
	}

	BeforeAll(func() {
		first = startCluster()
		first.createNamespaces()
		var err error
		port, err = testbed.FreePorts(2)
		Expect(err).NotTo(HaveOccurred())
		pod, bsls = first.serve(newBSLS(port), port)
		claim = first.Claim(bsls)

		Expect(first.API.Client.Create(ctx, newVM())).To(Succeed())
		Eventually(func() error {
			var err error
			files = install(first.vmSecret())
			guest, err = connect(files)
			return err
		}).WithTimeout(provisionTimeout).WithPolling(2*time.Second).Should(Succeed(), "the guest logs in with its bootstrap")
		Expect(files.User + "@" + files.Host).To(Equal(guestUser))

		source = GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(source, "precious.txt"), content, 0o600)).To(Succeed())
		out, err := guest.Run(ctx, "snapshot", "create", source)
		Expect(err).NotTo(HaveOccurred(), out)
		ids, err := guest.SnapshotIDs(ctx, source)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))
		snap = ids[0]
	})

	It("exports every metric its dashboard and alerts use, from the running binaries", func() {
		names := map[string][]string{} // metric -> where it is used
		for _, read := range []struct {
			file  string
			parse func([]byte) ([]promexpr.Expr, error)
		}{{"dashboard.json", promexpr.Dashboard}, {"alerts.yaml", promexpr.Rules}} {
			data, err := os.ReadFile(filepath.Join(monitoringFiles, read.file))
			Expect(err).NotTo(HaveOccurred())
			exprs, err := read.parse(data)
			Expect(err).NotTo(HaveOccurred())
			for _, e := range exprs {
				used, err := promexpr.MetricNames(e.Query)
				Expect(err).NotTo(HaveOccurred(), "%s in %s", e.Where, read.file)
				for _, n := range used {
					names[n] = append(names[n], read.file+": "+e.Where)
				}
			}
		}
		Expect(len(names)).To(BeNumerically(">", 15), "the files name too few metrics to be the chart's")

		ca := x509.NewCertPool()
		Expect(ca.AppendCertsFromPEM([]byte(bsls.Status.TLSCA))).To(BeTrue())
		endpoints := map[string]string{
			"controller and webhook (one metrics registry in this process)": "http://" + first.MetricsAddr + "/metrics",
			"server pod, user-sync container":                               "http://" + pod.Addr(kopiaserver.HealthPort) + "/metrics",
			"server pod, Kopia's own":                                       "https://" + pod.Addr(v1alpha1.DefaultServerPort) + "/metrics",
		}
		httpClient := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS12}}}
		// missing scrapes every endpoint and returns each metric used but
		// not exported, with where it is used. Series appear as the
		// product works (the audit sees the snapshot, maintenance runs,
		// the repository is measured): polled until none is missing.
		missing := func() []string {
			exported := map[string]bool{}
			for what, url := range endpoints {
				for _, f := range scrape(httpClient, what, url) {
					exported[f.GetName()] = true
					if t := f.GetType(); t == dto.MetricType_HISTOGRAM || t == dto.MetricType_SUMMARY {
						for _, suffix := range []string{"_bucket", "_sum", "_count"} {
							exported[f.GetName()+suffix] = true
						}
					}
				}
			}
			var out []string
			for n, where := range names {
				if !exported[n] {
					out = append(out, fmt.Sprintf("%s (used by %s)", n, strings.Join(where, "; ")))
				}
			}
			slices.Sort(out)
			return out
		}
		Eventually(missing).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(BeEmpty(),
			"metrics the dashboard or the alerts use that no running binary exports")
	})

	It("shows the VM's owner, in the VM's namespace, the snapshot its guest took", func() {
		p := &v1alpha1.GuestProtection{}
		Eventually(func() error {
			return first.API.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: vmName}, p)
		}).WithTimeout(provisionTimeout).WithPolling(time.Second).Should(Succeed())
		Eventually(func() (*v1alpha1.GuestProtection, error) {
			return p, first.API.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: vmName}, p)
		}).WithTimeout(provisionTimeout).WithPolling(time.Second).Should(And(
			HaveField("Status.Snapshots", BeEquivalentTo(1)),
			HaveField("Status.LastSnapshot.ID", snap),
			HaveField("Status.LastSnapshot.Path", source),
			HaveField("Status.LastSnapshot.Bytes", BeEquivalentTo(len(content))),
			HaveField("Status.Identity", guestUser),
			HaveField("Status.Conditions", ContainElement(And(HaveField("Type", v1alpha1.ConditionGuestConnected), HaveField("Status", metav1.ConditionTrue))))))
	})

	// A deliberate rotation ("Rotating the CA, overlapped" in
	// docs/backupstoragelocationserver.md) with real guests and their
	// bootstraps as the controller renders them. That it waits for a
	// running guest that booted without the next CA is pkg/kopiaserver's
	// spec: here the VM runs no instance, so nothing waits.
	It("rotates its CA: a guest booting meanwhile is given both CAs, and keeps the server through the switch", func() {
		c := first.API.Client
		oldPin := bsls.Status.TLSFingerprint
		ca := &corev1.Secret{}
		Expect(c.Get(ctx, client.ObjectKey{Namespace: storageNamespace, Name: kopiaserver.CASecretName(bsls)}, ca)).To(Succeed())
		patch := client.MergeFrom(ca.DeepCopy())
		ca.Annotations[kopiaserver.AnnotationRotateCA] = "yearly"
		Expect(c.Patch(ctx, ca, patch)).To(Succeed())

		By("the VM's bootstrap is rendered again with the current CA and the next, with which a booting guest restores")
		var during guestFiles
		Eventually(func() int {
			during = install(first.vmSecret())
			return bytes.Count(during.CA, []byte("BEGIN CERTIFICATE"))
		}).WithTimeout(provisionTimeout).WithPolling(2 * time.Second).Should(Equal(2))
		Expect(during.Password).To(Equal(files.Password), "the same credentials")
		booted, err := connect(during)
		Expect(err).NotTo(HaveOccurred())
		restoreAndCompare(booted, snap, content)

		By("the server switches to the next CA, and says so")
		Eventually(func() (string, error) {
			return bsls.Status.TLSFingerprint, c.Get(ctx, client.ObjectKeyFromObject(bsls), bsls)
		}).WithTimeout(provisionTimeout).ShouldNot(Equal(oldPin))
		Expect(bsls.Status.CARotation).To(BeNil())
		Eventually(func() ([]string, error) {
			return first.Events(ctx, storageNamespace, "BackupStorageLocationServer", bsls.Name)
		}).WithTimeout(provisionTimeout).Should(ContainElements(
			HavePrefix("Normal "+kopiaserver.ReasonCARotationStarted+": Rotating the CA (yearly)"),
			HavePrefix("Normal "+kopiaserver.ReasonCARotated+": The server switches from CA SHA-256 "+oldPin+" to SHA-256 "+bsls.Status.TLSFingerprint)))
		var after guestFiles
		Eventually(func() []byte {
			after = install(first.vmSecret())
			return after.CA
		}).WithTimeout(provisionTimeout).WithPolling(2 * time.Second).Should(Equal([]byte(bsls.Status.TLSCA)))

		By("the server's next pod serves a certificate of the new CA: the guest given both CAs and one given the new alone restore through it, one given the old alone cannot")
		ports, err := testbed.FreePorts(2)
		Expect(err).NotTo(HaveOccurred())
		_, err = first.ServeBSLS(ctx, first, bsls, ports)
		Expect(err).NotTo(HaveOccurred())
		through := func(f guestFiles) guestFiles {
			f.URL = strings.Replace(f.URL, fmt.Sprintf(":%d", port), fmt.Sprintf(":%d", ports), 1)
			return f
		}
		for _, f := range []guestFiles{during, after} {
			k, err := connect(through(f))
			Expect(err).NotTo(HaveOccurred())
			restoreAndCompare(k, snap, content)
		}
		_, err = connect(through(files))
		Expect(err).To(MatchError(ContainSubstring("certificate signed by unknown authority")), "why the rotation waits for guests that booted before it")

		// From here on the story's guest is one that booted during the
		// rotation: its connect script connects with the bootstrap it got.
		files = during
		out, err := guest.Connect(ctx, during.URL, during.CA, during.User+"@"+during.Host, during.Password)
		Expect(err).NotTo(HaveOccurred(), out)
	})

	It("serves the same users and CA from a new cluster given the same storage and the kept Secrets, and the guest restores without a new bootstrap", func() {
		// What docs/disaster-recovery.md says to keep, as a backup tool
		// would hand it back: without uid, resourceVersion or owner.
		get := func(c client.Client, namespace, name string, obj client.Object) {
			GinkgoHelper()
			Expect(c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj)).To(Succeed())
			scrub(obj)
		}
		carried.repositoryPassword, carried.ca, carried.vmSecret = &corev1.Secret{}, &corev1.Secret{}, &corev1.Secret{}
		carried.vm = &kubevirtv1.VirtualMachine{}
		get(first.API.Client, storageNamespace, kopiaserver.RepositoryPassword(bsls).Name, carried.repositoryPassword)
		get(first.API.Client, storageNamespace, kopiaserver.CASecretName(bsls), carried.ca)
		get(first.API.Client, vmNamespace, v1alpha1.CredentialSecretName(vmName), carried.vmSecret)
		get(first.API.Client, vmNamespace, vmName, carried.vm)
		oldPin, oldCA := bsls.Status.TLSFingerprint, bsls.Status.TLSCA

		By("losing the first cluster: its API server, controllers and server pod stop")
		first.lose()

		By("restoring the kept objects into a new cluster, then attaching the same storage")
		second := startCluster()
		second.createNamespaces()
		for _, obj := range []client.Object{carried.repositoryPassword.DeepCopy(), carried.ca.DeepCopy(), carried.vmSecret.DeepCopy(), carried.vm.DeepCopy()} {
			Expect(second.API.Client.Create(ctx, obj)).To(Succeed(), "restore %T %s", obj, obj.GetName())
		}
		second.UseClaim(newBSLS(port), claim)
		_, restored := second.serve(newBSLS(port), port)
		Expect(restored.Status.TLSFingerprint).To(Equal(oldPin), "the same CA, so the guests' pin holds")
		Expect(restored.Status.TLSCA).To(Equal(oldCA))

		oldBootstrapRestores()

		By("nothing was injected again: the VM's Secret holds the bootstrap it had, and the new VM owns it")
		vm := &kubevirtv1.VirtualMachine{}
		Expect(second.API.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: vmName}, vm)).To(Succeed())
		Eventually(func() []metav1.OwnerReference { return second.vmSecret().OwnerReferences }).WithTimeout(provisionTimeout).
			Should(ContainElement(HaveField("UID", vm.UID)), "the controller adopts the restored Secret for the new VM")
		s := second.vmSecret()
		Expect(s.Data[v1alpha1.SecretKeyPassword]).To(Equal(carried.vmSecret.Data[v1alpha1.SecretKeyPassword]))
		Expect(s.Data[v1alpha1.SecretKeyUserData]).To(Equal(carried.vmSecret.Data[v1alpha1.SecretKeyUserData]))
	})

	// The CA Secret is the one thing an admin may fail to carry to a new
	// cluster. Its key is derived from the repository password the
	// controller generated, so the new cluster makes that key again: a new
	// certificate (the pin is new), but the same name and key, and the
	// guest's TLS verification accepts the leaves it signs with the
	// certificate the guest already holds.
	It("without the CA Secret: the CA's key is made again from the repository password, and the guest keeps trusting the server with its old bootstrap", func() {
		third := startCluster()
		third.createNamespaces()
		for _, obj := range []client.Object{carried.repositoryPassword.DeepCopy(), carried.vmSecret.DeepCopy(), carried.vm.DeepCopy()} {
			Expect(third.API.Client.Create(ctx, obj)).To(Succeed(), "restore %T %s", obj, obj.GetName())
		}
		third.UseClaim(newBSLS(port), claim)
		_, restored := third.serve(newBSLS(port), port)
		Expect(restored.Status.TLSCA).NotTo(Equal(string(files.CA)), "a new certificate: the first cluster's is not in the new one")
		Expect(publicKeysOf(string(files.CA))).To(ContainElement(publicKeysOf(restored.Status.TLSCA)[0]), "for a key the guests already trust")

		oldBootstrapRestores()

		By("the controller renders the VM's bootstrap again with the new certificate and the same credentials, and it works as well")
		var next guestFiles
		Eventually(func() []byte {
			next = install(third.vmSecret())
			return next.CA
		}).WithTimeout(provisionTimeout).WithPolling(2 * time.Second).Should(Equal([]byte(restored.Status.TLSCA)))
		Expect(next.Password).To(Equal(files.Password), "the same password: the guest's identity and its snapshots are kept")
		Expect(next.URL).To(Equal(files.URL))
		Eventually(func() ([]string, error) {
			return third.Events(ctx, vmNamespace, "VirtualMachine", vmName)
		}).WithTimeout(provisionTimeout).Should(ContainElement(ContainSubstring("BootstrapUpdated")))
		fresh, err := connect(next)
		Expect(err).NotTo(HaveOccurred())
		restoreAndCompare(fresh, snap, content)
	})
})

// publicKeysOf is the DER of the public key of each certificate in
// pemData.
func publicKeysOf(pemData string) [][]byte {
	GinkgoHelper()
	certs, err := certutil.ParseCertsPEM([]byte(pemData))
	Expect(err).NotTo(HaveOccurred())
	keys := make([][]byte, len(certs))
	for i, c := range certs {
		keys[i] = c.RawSubjectPublicKeyInfo
	}
	return keys
}

// scrub removes what a new cluster gives an object itself, as a backup
// tool restores it: identity, version, owners, status.
func scrub(obj client.Object) {
	obj.SetUID("")
	obj.SetResourceVersion("")
	obj.SetCreationTimestamp(metav1.Time{})
	obj.SetManagedFields(nil)
	obj.SetOwnerReferences(nil)
	obj.SetFinalizers(nil)
	obj.SetGeneration(0)
	if vm, ok := obj.(*kubevirtv1.VirtualMachine); ok {
		vm.Status = kubevirtv1.VirtualMachineStatus{}
	}
}

// restoreAndCompare restores snapshot id with k and compares its file
// with want.
func restoreAndCompare(k *testbed.KopiaClient, id string, want []byte) {
	GinkgoHelper()
	target := filepath.Join(GinkgoT().TempDir(), "restored")
	out, err := k.Run(ctx, "snapshot", "restore", id, target)
	Expect(err).NotTo(HaveOccurred(), out)
	got, err := os.ReadFile(filepath.Join(target, "precious.txt"))
	Expect(err).NotTo(HaveOccurred())
	Expect(got).To(Equal(want))
}

// scrape reads one /metrics endpoint.
func scrape(c *http.Client, what, url string) map[string]*dto.MetricFamily {
	GinkgoHelper()
	resp, err := c.Get(url)
	Expect(err).NotTo(HaveOccurred(), "scrape %s at %s", what, url)
	defer resp.Body.Close()
	Expect(resp.StatusCode).To(Equal(http.StatusOK), "scrape %s at %s", what, url)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	Expect(err).NotTo(HaveOccurred(), "parse the metrics of %s", what)
	return families
}
