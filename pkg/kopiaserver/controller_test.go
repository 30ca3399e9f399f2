package kopiaserver_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"strconv"
	"strings"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

const (
	controllerNamespace = "guestbackup-system"
	// reconciled bounds how long the controller may take to act on a change.
	reconciled = 20 * time.Second
	// provisioned bounds how long a Secret change may take to reach a guest.
	provisioned = 30 * time.Second
	// caRotationOverlap is the controller's least overlap of a CA rotation
	// here.
	caRotationOverlap = 5 * time.Second
)

// runController starts the controller's reconcilers in-process against
// api, as cmd/controller wires them and with its cache, with the
// ClusterRole the chart would have installed for them to bind; stop ends
// them.
func runController(api *testbed.APIServer, o testbed.ManagerOptions, configure ...func(*kopiaserver.Reconciler)) (stop func() error, err error) {
	// What the chart installs for the controller to bind to the server
	// pods of BSLSs with several replicas.
	if err := api.CreateServerMaintenanceRole(); err != nil {
		return nil, err
	}
	o.Cache = controller.Cache()
	return testbed.RunManager(api, o, func(mgr ctrl.Manager) error {
		r := &kopiaserver.Reconciler{Image: "guestbackup:test", ControllerNamespace: controllerNamespace, ActivityInterval: time.Second}
		for _, c := range configure {
			c(r)
		}
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
		return (&credentials.Hasher{Client: mgr.GetClient()}).SetupWithManager(mgr, 2)
	})
}

// startController runs the controller in-process for the current
// container, its reconciler adjusted by configure, and returns the
// loopback address of its metrics endpoint.
func startController(api *testbed.APIServer, configure ...func(*kopiaserver.Reconciler)) (metricsAddr string) {
	GinkgoHelper()
	port, err := testbed.FreePort()
	Expect(err).NotTo(HaveOccurred())
	metricsAddr = "127.0.0.1:" + strconv.Itoa(port)
	stop, err := runController(api, testbed.ManagerOptions{Logger: GinkgoLogr, MetricsAddr: metricsAddr}, configure...)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(stop()).To(Succeed()) })
	return metricsAddr
}

// credentialSecret is a per-VM Secret as the webhook writes it.
func credentialSecret(vm, namespace, bslsNamespace, bslsName, password, generation string) *corev1.Secret {
	return testbed.CredentialSecret(namespace, vm, bslsNamespace+"/"+bslsName, password, generation)
}

// createCredential creates, as the cluster admin, the VirtualMachine a
// credential Secret is labelled for (opted in to the Secret's server), then
// the Secret as the VM reconciler leaves it adopted: controlled by that VM.
// A user is provisioned from those facts only (docs/design.md, decision 10).
func createCredential(ctx context.Context, api *testbed.APIServer, s *corev1.Secret) error {
	server := types.NamespacedName{Namespace: s.Labels[v1alpha1.LabelServerNamespace], Name: s.Labels[v1alpha1.LabelServerName]}
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Labels[v1alpha1.LabelVM], Namespace: s.Namespace,
			Annotations: map[string]string{v1alpha1.AnnotationServer: server.String()},
		},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{}}},
			},
		},
	}
	if err := api.Client.Create(ctx, vm); err != nil {
		return fmt.Errorf("create the VirtualMachine of Secret %s: %w", s.Name, err)
	}
	s.OwnerReferences = []metav1.OwnerReference{vmsecret.OwnerReference(vm.Name, vm.UID)}
	return api.Client.Create(ctx, s)
}

var _ = Describe("The BackupStorageLocationServer controller", Ordered, func() {
	const ns = "storage"
	var (
		ctx         context.Context
		api         *testbed.APIServer
		binaries    map[string]string
		metricsAddr string
	)

	get := func(name string, obj client.Object) func() error {
		return func() error { return api.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj) }
	}
	bslsNamed := func(name string) *v1alpha1.BackupStorageLocationServer {
		GinkgoHelper()
		b := &v1alpha1.BackupStorageLocationServer{}
		Expect(get(name, b)()).To(Succeed())
		return b
	}
	condition := func(name, t string) func() *metav1.Condition {
		return func() *metav1.Condition {
			b := &v1alpha1.BackupStorageLocationServer{}
			if err := get(name, b)(); err != nil {
				return nil
			}
			return meta.FindStatusCondition(b.Status.Conditions, t)
		}
	}
	haveCondition := func(status metav1.ConditionStatus, reason, message string) OmegaMatcher {
		return And(Not(BeNil()), HaveField("Status", status), HaveField("Reason", reason), HaveField("Message", ContainSubstring(message)))
	}
	create := func(name string, spec v1alpha1.BackupStorageLocationServerSpec) *v1alpha1.BackupStorageLocationServer {
		GinkgoHelper()
		b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
		Expect(api.Client.Create(ctx, b)).To(Succeed())
		return b
	}
	events := func(name string) func() []string { return bslsEvents(ctx, api, ns, name) }
	// eventCount is how many times the Event on BSLS name whose message
	// starts with prefix was recorded (0: none).
	eventCount := func(name, prefix string) int32 {
		list := &corev1.EventList{}
		Expect(api.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == "BackupStorageLocationServer" && e.InvolvedObject.Name == name && strings.HasPrefix(e.Message, prefix) {
				return e.Count
			}
		}
		return 0
	}
	filesystem := v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}

	BeforeAll(func() {
		ctx = context.Background()
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
		for _, name := range []string{ns, controllerNamespace, "team-a", "team-b"} {
			labels := map[string]string{"backup": "allowed"}
			if name == "team-b" {
				labels = nil
			}
			Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})).To(Succeed())
		}
		binaries = serverBinaries(GinkgoT())
		metricsAddr = startController(api, func(r *kopiaserver.Reconciler) {
			r.CARotationMinOverlap, r.CARotationClientOverlap = caRotationOverlap, caRotationOverlap
		})
	})

	Describe("a filesystem BSLS with every default", Ordered, func() {
		const name = "main"
		var (
			bsls       *v1alpha1.BackupStorageLocationServer
			deployment *appsv1.Deployment
			pod        *testbed.Pod
			pin        string
			claimDir   string
		)
		connect := func(user, password string) func() error {
			return func() error {
				out, err := testbed.NewKopiaClient(GinkgoT()).ConnectPinned(ctx, "https://"+pod.Addr(v1alpha1.DefaultServerPort), pin, user, password)
				if err != nil {
					return fmt.Errorf("%w: %s", err, out)
				}
				return nil
			}
		}

		BeforeAll(func() {
			bsls = create(name, v1alpha1.BackupStorageLocationServerSpec{
				Storage: filesystem,
				Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "allowed"}}},
			})
			claimDir = GinkgoT().TempDir()
		})

		It("issues a CA of its own and reports its pin and the endpoint", func() {
			Eventually(condition(name, v1alpha1.ConditionCertificateReady)).WithTimeout(reconciled).
				Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonCertificateIssued, "Secret main-tls"))
			ca := &corev1.Secret{}
			Expect(get(kopiaserver.CASecretName(bsls), ca)()).To(Succeed())
			certs, err := certutil.ParseCertsPEM(ca.Data[corev1.TLSCertKey])
			Expect(err).NotTo(HaveOccurred())
			b := bslsNamed(name)
			Expect(b.Status.TLSFingerprint).To(Equal(pki.Fingerprint(certs[0])))
			Expect(b.Status.Endpoint).To(Equal("https://main.storage.svc:51515"))
			pin = b.Status.TLSFingerprint

			leaf := &corev1.Secret{}
			Expect(get(kopiaserver.TLSSecretName(bsls), leaf)()).To(Succeed())
			leafCerts, err := certutil.ParseCertsPEM(leaf.Data[corev1.TLSCertKey])
			Expect(err).NotTo(HaveOccurred())
			Expect(leafCerts[0].DNSNames).To(ContainElements("main.storage.svc", "main.storage.svc.cluster.local"))
			Expect(leafCerts[0].CheckSignatureFrom(certs[0])).To(Succeed())
		})

		It("keeps what holds the backups when the BSLS goes: claim, repository password and CA have no owner", func() {
			claim := &corev1.PersistentVolumeClaim{}
			Eventually(get(kopiaserver.ClaimName(bsls), claim)).WithTimeout(reconciled).Should(Succeed())
			Expect(claim.Spec.Resources.Requests[corev1.ResourceStorage]).To(Equal(resource.MustParse("10Gi")))
			password, ca := &corev1.Secret{}, &corev1.Secret{}
			Expect(get(kopiaserver.RepositoryPassword(bsls).Name, password)()).To(Succeed())
			Expect(get(kopiaserver.CASecretName(bsls), ca)()).To(Succeed())
			for _, obj := range []client.Object{claim, password, ca} {
				Expect(obj.GetOwnerReferences()).To(BeEmpty(), "%T %s", obj, obj.GetName())
				Expect(obj.GetAnnotations()).To(HaveKeyWithValue(kopiaserver.AnnotationKeep, ContainSubstring("not deleted with it")))
			}
			Expect(password.Data["password"]).To(HaveLen(43)) // 256 bits
			Eventually(events(name)).Should(ContainElement(ContainSubstring("RepositoryPasswordGenerated")))
		})

		// What the Deployment, Service and NetworkPolicy say is in
		// testdata/golden (TestServerObjectsGolden); this is what the
		// API server holds.
		It("writes a server Deployment, Service and NetworkPolicy it owns, with no password in the pod spec", func() {
			deployment = &appsv1.Deployment{}
			Eventually(get(kopiaserver.DeploymentName(bsls), deployment)).WithTimeout(reconciled).Should(Succeed())
			Expect(deployment.Spec.Template.Annotations).To(HaveKeyWithValue(kopiaserver.AnnotationTLSChecksum, Not(BeEmpty())))
			spec := deployment.Spec.Template.Spec
			password := &corev1.Secret{}
			Expect(get(kopiaserver.RepositoryPassword(bsls).Name, password)()).To(Succeed())
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				Expect(strings.Join(c.Args, " ")).NotTo(ContainSubstring(string(password.Data["password"])))
				for _, e := range c.Env {
					Expect(e.Value).NotTo(ContainSubstring(string(password.Data["password"])))
				}
			}
			svc, policy := &corev1.Service{}, &networkingv1.NetworkPolicy{}
			Expect(get(kopiaserver.ServiceName(bsls), svc)()).To(Succeed())
			Expect(get(kopiaserver.DeploymentName(bsls), policy)()).To(Succeed())
			for _, obj := range []client.Object{deployment, svc, policy} {
				Expect(obj.GetOwnerReferences()).To(ConsistOf(HaveField("Name", name)), "%T %s", obj, obj.GetName())
			}

			Expect(condition(name, v1alpha1.ConditionServerAvailable)()).To(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonServerStarting, "no available server pod"))
			Expect(condition(name, v1alpha1.ConditionReady)()).To(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonNotReady, "ServerAvailable"))
		})

		Describe("once the pod it specified runs", Ordered, func() {
			BeforeAll(func() {
				deployment = &appsv1.Deployment{}
				Eventually(get(kopiaserver.DeploymentName(bsls), deployment)).WithTimeout(reconciled).Should(Succeed())
				pod = testbed.RunPod(GinkgoT(), testbed.PodOptions{
					Namespace: ns,
					Spec:      deployment.Spec.Template.Spec,
					Binaries:  binaries,
					Claims:    map[string]string{kopiaserver.ClaimName(bsls): claimDir},
					API:       api,
				})
				Expect(pod.WaitReady(2 * time.Minute)).To(Succeed())
				markAvailable(ctx, api, deployment)
			})

			It("becomes Ready", func() {
				Eventually(condition(name, v1alpha1.ConditionReady)).WithTimeout(reconciled).
					Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonReady, "https://main.storage.svc:51515"))
				Expect(condition(name, v1alpha1.ConditionRepositoryReady)()).To(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonRepositoryOpened, "PersistentVolumeClaim main-repository"))
				Expect(bslsNamed(name).Status.ObservedGeneration).To(Equal(bslsNamed(name).Generation))
			})

			It("reports the repository's maintenance, which its pod runs as guestbackup's owner, in its status", func() {
				Eventually(func(g Gomega) {
					m := bslsNamed(name).Status.Maintenance
					g.Expect(m).NotTo(BeNil())
					g.Expect(m.Owner).To(Equal("guestbackup-maintenance@" + name + "." + ns))
					g.Expect(m.LastCycle).To(Equal("full"))
					g.Expect(m.LastSuccess).NotTo(BeNil())
					g.Expect(m.NextRun).NotTo(BeNil())
					g.Expect(m.Failure).To(BeEmpty())
				}).WithTimeout(reconciled).Should(Succeed())
			})

			It("provisions a VM's user from its credential Secret within seconds, pinned to status.tlsFingerprint", func() {
				password := testbed.RandomPassword()
				Expect(createCredential(ctx, api, credentialSecret("web", "team-a", ns, name, password, "1"))).To(Succeed())
				Eventually(connect("web@team-a", password)).WithTimeout(provisioned).Should(Succeed())
				Eventually(func() int32 { return bslsNamed(name).Status.Users }).WithTimeout(reconciled).Should(Equal(int32(1)))
				Expect(connect("web@team-a", "wrong")()).To(MatchError(ContainSubstring("access denied")))
				labels := map[string]string{"namespace": ns, "bsls": name}
				Expect(testbed.Metric(metricsAddr, "guestbackup_bsls_users", labels)).To(Equal(1.0))
				Expect(testbed.Metric(metricsAddr, "guestbackup_bsls_ready", labels)).To(Equal(1.0))

				By("hashing the password once and keeping the hash beside it")
				s := &corev1.Secret{}
				Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "web-guestbackup"}, s)).To(Succeed())
				Expect(s.Data).To(HaveKeyWithValue(v1alpha1.SecretKeyPasswordHashGeneration, []byte("1")))
				Expect(credentials.HashFor(s).Matches(password)).To(BeTrue())
			})

			It("lets a guest delete its own snapshots when the BSLS is not append-only", func() {
				s := &corev1.Secret{}
				Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "web-guestbackup"}, s)).To(Succeed())
				client := testbed.NewKopiaClient(GinkgoT())
				out, err := client.ConnectPinned(ctx, "https://"+pod.Addr(v1alpha1.DefaultServerPort), pin, "web@team-a", string(s.Data[v1alpha1.SecretKeyPassword]))
				Expect(err).NotTo(HaveOccurred(), out)
				data := GinkgoT().TempDir()
				out, err = client.Run(ctx, "snapshot", "create", data)
				Expect(err).NotTo(HaveOccurred(), out)
				ids, err := client.SnapshotIDs(ctx, data)
				Expect(err).NotTo(HaveOccurred())
				Expect(ids).To(HaveLen(1))

				By("publishing it in the activity ConfigMap, through the pod's own Role")
				Eventually(func() (activity.Snapshot, error) {
					cm := &corev1.ConfigMap{}
					if err := get(activity.ConfigMapName(name, userset.ShardOf("web@team-a")), cm)(); err != nil {
						return activity.Snapshot{}, err
					}
					guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
					return guests["web@team-a"].Last, err
				}).WithTimeout(reconciled).Should(And(HaveField("ID", ids[0]), HaveField("Path", data)))
				By("and in the guest's catalogue, through the same Role")
				Eventually(func() ([]activity.Snapshot, error) {
					cm := &corev1.ConfigMap{}
					if err := get(activity.CatalogueConfigMapName(name, activity.CatalogueShardOf("web@team-a")), cm)(); err != nil {
						return nil, err
					}
					catalogues, err := activity.DecodeCatalogues([]byte(cm.Data[activity.CatalogueKey]))
					return catalogues["web@team-a"], err
				}).WithTimeout(reconciled).Should(HaveExactElements(And(HaveField("ID", ids[0]), HaveField("Path", data))))

				out, err = client.Run(ctx, "snapshot", "delete", ids[0], "--delete")
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(client.SnapshotIDs(ctx, data)).To(BeEmpty())
			})

			It("accepts only the new password after a rotation", func() {
				s := &corev1.Secret{}
				Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "web-guestbackup"}, s)).To(Succeed())
				old := string(s.Data[v1alpha1.SecretKeyPassword])
				rotated := testbed.RandomPassword()
				s.Data[v1alpha1.SecretKeyPassword] = []byte(rotated)
				s.Data[v1alpha1.SecretKeyGeneration] = []byte("2")
				Expect(api.Client.Update(ctx, s)).To(Succeed())
				Eventually(connect("web@team-a", rotated)).WithTimeout(provisioned).Should(Succeed())
				Expect(connect("web@team-a", old)()).To(MatchError(ContainSubstring("access denied")))
			})

			It("refuses a VM in a namespace its namespaceSelector does not select, and says why", func() {
				password := testbed.RandomPassword()
				Expect(createCredential(ctx, api, credentialSecret("db", "team-b", ns, name, password, "1"))).To(Succeed())
				Eventually(events(name)).WithTimeout(reconciled).Should(ContainElement(
					"Warning UserRefused: Credential Secret team-b/db-guestbackup is not provisioned: namespace team-b is not selected by spec.access.namespaceSelector"))
				Expect(connect("db@team-b", password)()).To(MatchError(ContainSubstring("access denied")))

				By("saying it once, not at every reconcile, which would spend the Events' spam budget")
				vault := credentialSecret("vault", "team-b", ns, name, testbed.RandomPassword(), "1")
				Expect(createCredential(ctx, api, vault)).To(Succeed())
				// The pass that refuses vault (sorted after db) also finds db refused.
				Eventually(events(name)).WithTimeout(reconciled).Should(ContainElement(
					"Warning UserRefused: Credential Secret team-b/vault-guestbackup is not provisioned: namespace team-b is not selected by spec.access.namespaceSelector"))
				Expect(eventCount(name, "Credential Secret team-b/db-guestbackup is not provisioned")).To(BeEquivalentTo(1))
				Expect(api.Client.Delete(ctx, vault)).To(Succeed())

				By("provisioning it once the namespace is selected")
				nsObj := &corev1.Namespace{}
				Expect(api.Client.Get(ctx, types.NamespacedName{Name: "team-b"}, nsObj)).To(Succeed())
				nsObj.Labels = map[string]string{"backup": "allowed"}
				Expect(api.Client.Update(ctx, nsObj)).To(Succeed())
				Eventually(connect("db@team-b", password)).WithTimeout(provisioned).Should(Succeed())
			})

			It("revokes a user whose credential Secret is deleted", func() {
				s := &corev1.Secret{}
				Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: "team-b", Name: "db-guestbackup"}, s)).To(Succeed())
				password := string(s.Data[v1alpha1.SecretKeyPassword])
				Expect(api.Client.Delete(ctx, s)).To(Succeed())
				Eventually(connect("db@team-b", password)).WithTimeout(provisioned).Should(MatchError(ContainSubstring("access denied")))
				Eventually(func() int32 { return bslsNamed(name).Status.Users }).WithTimeout(reconciled).Should(Equal(int32(1)))
			})

			It("renews the leaf under the same CA and rolls the server, so the guests' pin still holds", func() {
				before := deployment.Spec.Template.Annotations[kopiaserver.AnnotationTLSChecksum]
				// A leaf that no longer names the Service is re-issued at once.
				leaf := &corev1.Secret{}
				Expect(get(kopiaserver.TLSSecretName(bsls), leaf)()).To(Succeed())
				Expect(api.Client.Delete(ctx, leaf)).To(Succeed())
				Eventually(func() string {
					d := &appsv1.Deployment{}
					if err := get(kopiaserver.DeploymentName(bsls), d)(); err != nil {
						return ""
					}
					return d.Spec.Template.Annotations[kopiaserver.AnnotationTLSChecksum]
				}).WithTimeout(reconciled).ShouldNot(Or(BeEmpty(), Equal(before)))
				Expect(bslsNamed(name).Status.TLSFingerprint).To(Equal(pin))
			})

			// A namespace clean-up, a restore that skipped
			// Secrets or a mistake must not cost running guests their trust.
			It("re-creates a deleted CA Secret with the same certificate and key, says so, and keeps the leaf under it", func() {
				ca := &corev1.Secret{}
				Expect(get(kopiaserver.CASecretName(bsls), ca)()).To(Succeed())
				before := ca.DeepCopy()
				caCerts, err := certutil.ParseCertsPEM(before.Data[corev1.TLSCertKey])
				Expect(err).NotTo(HaveOccurred())
				Expect(api.Client.Delete(ctx, ca)).To(Succeed())

				Eventually(func(g Gomega) {
					now := &corev1.Secret{}
					g.Expect(get(kopiaserver.CASecretName(bsls), now)()).To(Succeed())
					g.Expect(now.DeletionTimestamp).To(BeNil(), "re-created, not left terminating")
					g.Expect(now.Data[corev1.TLSCertKey]).To(Equal(before.Data[corev1.TLSCertKey]), "the same CA certificate")
					g.Expect(now.Data[corev1.TLSPrivateKeyKey]).To(Equal(before.Data[corev1.TLSPrivateKeyKey]), "the same CA key")
					g.Expect(now.Annotations).To(HaveKeyWithValue(kopiaserver.AnnotationKeep, before.Annotations[kopiaserver.AnnotationKeep]))
				}).WithTimeout(reconciled).Should(Succeed())
				Eventually(events(name)).WithTimeout(reconciled).Should(ContainElement(And(
					HavePrefix("Warning "+kopiaserver.ReasonCASecretRestored+": Secret storage/main-ca was deleted"),
					ContainSubstring(pin))))

				By("keeping the server's leaf under that CA and the guests' pin")
				Consistently(func(g Gomega) {
					leaf := &corev1.Secret{}
					g.Expect(get(kopiaserver.TLSSecretName(bsls), leaf)()).To(Succeed())
					chain, err := certutil.ParseCertsPEM(leaf.Data[corev1.TLSCertKey])
					g.Expect(err).NotTo(HaveOccurred())
					roots := x509.NewCertPool()
					roots.AddCert(caCerts[0])
					_, err = chain[0].Verify(x509.VerifyOptions{DNSName: "main.storage.svc", Roots: roots})
					g.Expect(err).NotTo(HaveOccurred(), "the leaf chains to the CA guests trust")
					g.Expect(bslsNamed(name).Status.TLSFingerprint).To(Equal(pin))
				}).WithTimeout(3 * time.Second).Should(Succeed())
				Expect(events(name)()).NotTo(ContainElement(HavePrefix("Warning "+kopiaserver.ReasonCAChanged)), "the CA did not change")
				Expect(get(kopiaserver.CARescueSecretName(bsls), &corev1.Secret{})()).NotTo(Succeed(), "no copy of the key is left behind")
			})

			// A deliberate rotation must not cost a running guest its
			// backups: guests trust their CA only, and take a new one at
			// their next boot.
			It("rotates the CA overlapped: guests are given the next CA beside the current one, and the server switches once no running guest booted without it", func() {
				ca := &corev1.Secret{}
				Expect(get(kopiaserver.CASecretName(bsls), ca)()).To(Succeed())
				oldCerts, err := certutil.ParseCertsPEM(ca.Data[corev1.TLSCertKey])
				Expect(err).NotTo(HaveOccurred())
				checksum := func() string {
					d := &appsv1.Deployment{}
					if err := get(kopiaserver.DeploymentName(bsls), d)(); err != nil {
						return ""
					}
					return d.Spec.Template.Annotations[kopiaserver.AnnotationTLSChecksum]
				}
				servedBefore := checksum()
				// A client the server refuses (anyone may create one in
				// their namespace) has no user to lose: it holds no
				// rotation up.
				Expect(api.Client.Create(ctx, &v1alpha1.BackupClient{
					ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "refused"},
					Spec: v1alpha1.BackupClientSpec{Server: v1alpha1.ServerReference{Namespace: bsls.Namespace, Name: bsls.Name},
						PasswordHash: &v1alpha1.PasswordHashSource{SecretName: "chosen-by-a-tenant"}},
				})).To(Succeed())
				ca.Annotations[kopiaserver.AnnotationRotateCA] = "yearly, change 2026-12"
				Expect(api.Client.Update(ctx, ca)).To(Succeed())

				By("giving guests the next CA after the current one, and keeping the server's certificate and pin")
				var rotation *v1alpha1.CARotationStatus
				Eventually(func() *v1alpha1.CARotationStatus {
					rotation = bslsNamed(name).Status.CARotation
					return rotation
				}).WithTimeout(reconciled).ShouldNot(BeNil())
				b := bslsNamed(name)
				trusted, err := certutil.ParseCertsPEM([]byte(b.Status.TLSCA))
				Expect(err).NotTo(HaveOccurred())
				Expect(trusted).To(HaveLen(2))
				Expect(trusted[0].Equal(oldCerts[0])).To(BeTrue(), "the current CA first")
				Expect(pki.Fingerprint(trusted[1])).To(Equal(rotation.NextFingerprint))
				Expect(b.Status.TLSFingerprint).To(Equal(pin))
				Expect(rotation.Reason).To(Equal("yearly, change 2026-12"))
				Expect(rotation.WaitingVMs).To(ContainElement("team-a/web"), "its bootstrap does not carry the next CA yet")
				Expect(events(name)()).To(ContainElement(HavePrefix("Normal " + kopiaserver.ReasonCARotationStarted + ": Rotating the CA (yearly, change 2026-12)")))
				Expect(checksum()).To(Equal(servedBefore), "the server keeps serving the certificate every guest trusts")

				By("waiting for a guest whose VM started before its bootstrap carried the next CA")
				// web runs: virt-controller created its instance, and the
				// guest booted from the bootstrap its Secret held then.
				vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}}
				vmi.Spec.Domain.Devices = kubevirtv1.Devices{}
				Expect(api.Client.Create(ctx, vmi)).To(Succeed())
				vmi.Status.Phase = kubevirtv1.Running
				Expect(api.Client.Update(ctx, vmi)).To(Succeed()) // KubeVirt's instances have no status subresource
				// What the bootstrap reconciler does to each VM's Secret as
				// status.tlsCA changes (its rendering has its own specs, in
				// pkg/credentials): the record of what it rendered, and when.
				credentialSecrets := &corev1.SecretList{}
				Expect(api.Client.List(ctx, credentialSecrets, client.MatchingLabels(vmsecret.ServerLabels(client.ObjectKeyFromObject(bsls))))).To(Succeed())
				for i := range credentialSecrets.Items {
					s := &credentialSecrets.Items[i]
					vmsecret.SetRendered(s, b.Status.Endpoint, []byte(b.Status.TLSCA), time.Now())
					Expect(api.Client.Update(ctx, s)).To(Succeed())
				}
				Eventually(func() *v1alpha1.CARotationStatus { return bslsNamed(name).Status.CARotation }).WithTimeout(reconciled).
					Should(And(HaveField("Waiting", BeEquivalentTo(1)), HaveField("WaitingVMs", Equal([]string{"team-a/web"}))))
				// Past the overlap, only that guest holds the switch back.
				Consistently(func() string { return bslsNamed(name).Status.TLSFingerprint }).
					WithTimeout(caRotationOverlap + 2*time.Second).Should(Equal(pin))

				By("switching once that VM restarted: its new instance booted with both CAs")
				Expect(api.Client.Delete(ctx, vmi)).To(Succeed())
				restarted := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}}
				restarted.Spec.Domain.Devices = kubevirtv1.Devices{}
				Expect(api.Client.Create(ctx, restarted)).To(Succeed())
				restarted.Status.Phase = kubevirtv1.Running
				Expect(api.Client.Update(ctx, restarted)).To(Succeed())
				// The reconciler looks at instances again every 30 s.
				Eventually(func() string { return bslsNamed(name).Status.TLSFingerprint }).WithTimeout(time.Minute).Should(Equal(rotation.NextFingerprint))
				Expect(bslsNamed(name).Status.CARotation).To(BeNil())
				Expect(bslsNamed(name).Status.TLSCA).To(Equal(string(pki.EncodeCerts(trusted[1]))), "new guests are given the new CA alone")
				Eventually(events(name)).WithTimeout(reconciled).Should(ContainElements(
					HavePrefix("Normal "+kopiaserver.ReasonCARotated+": The server switches from CA SHA-256 "+pin+" to SHA-256 "+rotation.NextFingerprint+" (yearly, change 2026-12)"),
					HavePrefix("Normal "+kopiaserver.ReasonCAChanged+": The CA guests trust changed from SHA-256 "+pin+" to "+rotation.NextFingerprint+", as the rotation begun at")))
				now := &corev1.Secret{}
				Expect(get(kopiaserver.CASecretName(bsls), now)()).To(Succeed())
				Expect(now.Data).NotTo(HaveKey(kopiaserver.NextCACertKey))
				Expect(now.Data).NotTo(HaveKey(kopiaserver.NextCAKeyKey))
				Expect(now.Annotations).NotTo(HaveKey(kopiaserver.AnnotationRotateCA))
				Expect(now.Finalizers).To(ContainElement(kopiaserver.FinalizerCAGuard))
				password := &corev1.Secret{}
				Expect(get(kopiaserver.RepositoryPassword(bsls).Name, password)()).To(Succeed())
				Expect(password.Annotations).To(HaveKeyWithValue(kopiaserver.AnnotationCAKeyGeneration, "1"),
					"the new CA's key is the next generation's: a new cluster given the password makes it again")

				By("serving a certificate of the new CA, which guests given both CAs verify, and those given only the old one do not")
				Eventually(checksum).WithTimeout(reconciled).ShouldNot(Equal(servedBefore))
				leaf := &corev1.Secret{}
				Expect(get(kopiaserver.TLSSecretName(bsls), leaf)()).To(Succeed())
				chain, err := certutil.ParseCertsPEM(leaf.Data[corev1.TLSCertKey])
				Expect(err).NotTo(HaveOccurred())
				verifies := func(roots ...*x509.Certificate) error {
					pool := x509.NewCertPool()
					for _, c := range roots {
						pool.AddCert(c)
					}
					_, err := chain[0].Verify(x509.VerifyOptions{DNSName: "main.storage.svc", Roots: pool})
					return err
				}
				Expect(verifies(trusted...)).To(Succeed(), "a guest that booted during the rotation")
				Expect(verifies(trusted[1])).To(Succeed(), "a guest that boots from now on")
				Expect(verifies(oldCerts[0])).NotTo(Succeed())
				pin = rotation.NextFingerprint
			})

			It("replaces the CA when the admin marks its deletion as one, and announces what that costs the guests", func() {
				ca := &corev1.Secret{}
				Expect(get(kopiaserver.CASecretName(bsls), ca)()).To(Succeed())
				ca.Annotations[kopiaserver.AnnotationReplaceCA] = "the key left the building"
				Expect(api.Client.Update(ctx, ca)).To(Succeed())
				Expect(api.Client.Delete(ctx, ca)).To(Succeed())

				Eventually(func() string { return bslsNamed(name).Status.TLSFingerprint }).WithTimeout(reconciled).ShouldNot(Equal(pin))
				next := bslsNamed(name).Status.TLSFingerprint
				Eventually(events(name)).WithTimeout(reconciled).Should(ContainElement(
					HavePrefix("Warning " + kopiaserver.ReasonCAChanged + ": The CA guests trust changed from SHA-256 " + pin + " to " + next)))
				now := &corev1.Secret{}
				Expect(get(kopiaserver.CASecretName(bsls), now)()).To(Succeed())
				Expect(now.Finalizers).To(ContainElement(kopiaserver.FinalizerCAGuard), "the new CA is guarded in turn")
				Expect(now.Annotations).NotTo(HaveKey(kopiaserver.AnnotationReplaceCA))
				Expect(eventCount(name, "Secret storage/main-ca was deleted")).To(BeEquivalentTo(1), "restored once, by the spec before, not this time")

				By("deriving the new CA's key from the next generation: a replacement is a new key, and a new cluster given the password makes that one")
				Expect(now.Data[corev1.TLSPrivateKeyKey]).NotTo(Equal(ca.Data[corev1.TLSPrivateKeyKey]))
				password := &corev1.Secret{}
				Expect(get(kopiaserver.RepositoryPassword(bsls).Name, password)()).To(Succeed())
				Expect(password.Annotations).To(HaveKeyWithValue(kopiaserver.AnnotationCAKeyGeneration, "2"), "the rotation before took generation 1")
				Eventually(events(name)).WithTimeout(reconciled).Should(ContainElement(And(
					HavePrefix("Normal "+kopiaserver.ReasonCAIssued+": Issued a CA for the server in Secret main-ca"),
					ContainSubstring("derived from the repository password in Secret main-repository (key generation 2)"))))
			})
		})
	})

	DescribeTable("reports a bad spec in the condition that names the fix",
		func(name string, spec v1alpha1.BackupStorageLocationServerSpec, setup []client.Object, condType, reason, message string) {
			for _, obj := range setup {
				obj.SetNamespace(ns)
				Expect(api.Client.Create(ctx, obj)).To(Succeed())
			}
			create(name, spec)
			Eventually(condition(name, condType)).WithTimeout(reconciled).Should(haveCondition(metav1.ConditionFalse, reason, message))
			Expect(condition(name, v1alpha1.ConditionReady)()).To(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonNotReady, condType))
			Eventually(events(name)).Should(ContainElement(ContainSubstring("Warning " + reason + ": " + condType + ": " + message)))
			Expect(get(name+"-server", &appsv1.Deployment{})()).NotTo(Succeed(), "no server starts without its prerequisites")
		},
		Entry("a claim that does not exist", "missing-claim",
			v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{ClaimName: "nope"}}}, nil,
			v1alpha1.ConditionRepositoryReady, kopiaserver.ReasonClaimNotFound,
			"PersistentVolumeClaim nope not found in namespace storage: create it, or remove storage.filesystem.claimName"),
		Entry("S3 credentials without the secret key", "s3-half-credentials",
			v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{S3: &v1alpha1.S3Storage{Bucket: "backups", CredentialsSecret: corev1.LocalObjectReference{Name: "s3-creds"}}}},
			[]client.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3-creds"}, Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("AKIA")}}},
			v1alpha1.ConditionRepositoryReady, kopiaserver.ReasonCredentialsInvalid, "Secret s3-creds has no key AWS_SECRET_ACCESS_KEY"),
		Entry("a repository password Secret that does not exist", "missing-password",
			v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem, Repository: v1alpha1.RepositorySpec{PasswordSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "repo-pass"}, Key: "pw"}}}, nil,
			v1alpha1.ConditionRepositoryReady, kopiaserver.ReasonPasswordSecretInvalid,
			"Secret repo-pass not found in namespace storage: create it with the repository password in key pw"),
		Entry("a TLS Secret that does not exist", "missing-tls",
			v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem, TLS: v1alpha1.TLSSpec{SecretName: "my-tls"}}, nil,
			v1alpha1.ConditionCertificateReady, kopiaserver.ReasonTLSSecretNotFound, "Secret my-tls not found in namespace storage: create a kubernetes.io/tls Secret"),
		Entry("a TLS Secret without its CA", "tls-without-ca",
			v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem, TLS: v1alpha1.TLSSpec{SecretName: "leaf-only"}},
			[]client.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "leaf-only"}, Data: map[string][]byte{"tls.crt": []byte("x"), "tls.key": []byte("y")}}},
			v1alpha1.ConditionCertificateReady, kopiaserver.ReasonTLSSecretInvalid, "Secret leaf-only has no key ca.crt"),
		Entry("a Velero BSL while Velero is not installed", "velero-missing",
			v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Name: "default", Namespace: "velero"}}}, nil,
			v1alpha1.ConditionRepositoryReady, kopiaserver.ReasonBackupStorageLocationInvalid,
			"storage.backupStorageLocation names Velero BackupStorageLocation velero/default, but Velero's BackupStorageLocation CRD is not installed"),
		Entry("a cert-manager issuer that does not issue", "pending-issuer",
			v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem, TLS: v1alpha1.TLSSpec{IssuerRef: &v1alpha1.IssuerReference{Name: "absent", Kind: "ClusterIssuer"}}}, nil,
			v1alpha1.ConditionCertificateReady, kopiaserver.ReasonCertificatePending, "Certificate pending-issuer-server from cert-manager ClusterIssuer absent is not issued yet"),
	)

	// adminTLSSecret creates, as an admin would, a kubernetes.io/tls Secret
	// with a leaf for dnsName signed by a CA of the admin's, and returns the CA.
	adminTLSSecret := func(name, dnsName string) *pki.CA {
		GinkgoHelper()
		ca, err := pki.NewCA("the admin's CA", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		leaf, err := ca.IssueServing([]string{dnsName}, nil, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		key, err := leaf.KeyPEM()
		Expect(err).NotTo(HaveOccurred())
		Expect(api.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{"tls.crt": pki.EncodeCert(leaf.Cert), "tls.key": key, "ca.crt": ca.CertPEM()},
		})).To(Succeed())
		return ca
	}

	// The audit and the request status believe only the activity a BSLS
	// controls: a ConfigMap restored before its BSLS would hide its
	// shard's guests for good.
	It("adopts an activity ConfigMap that nothing controls, and leaves one another object controls", func() {
		restored := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: activity.ConfigMapName("restored", 3), Namespace: ns},
			Data:       map[string]string{activity.Key: `{"user":"web@team-a","snapshots":2}` + "\n"},
		}
		Expect(api.Client.Create(ctx, restored)).To(Succeed())
		other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "someone-else", Namespace: ns}}
		Expect(api.Client.Create(ctx, other)).To(Succeed())
		taken := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: activity.ConfigMapName("restored", 4), Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: other.Name, UID: other.UID, Controller: ptr.To(true)}},
		}}
		Expect(api.Client.Create(ctx, taken)).To(Succeed())
		b := create("restored", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem})

		Eventually(func(g Gomega) {
			cm := &corev1.ConfigMap{}
			g.Expect(get(restored.Name, cm)()).To(Succeed())
			g.Expect(metav1.IsControlledBy(cm, bslsNamed(b.Name))).To(BeTrue(), "adopted")
			g.Expect(cm.Labels).To(HaveKeyWithValue(activity.Label, b.Name))
			g.Expect(cm.Data).To(Equal(restored.Data), "its content is the server pod's: kept")
		}).WithTimeout(reconciled).Should(Succeed())
		cm := &corev1.ConfigMap{}
		Expect(get(taken.Name, cm)()).To(Succeed())
		Expect(metav1.GetControllerOf(cm)).To(HaveField("UID", other.UID), "another object's is not taken from it")
	})

	It("lets go of its CA Secret when the BSLS is deleted: the Secret stays, and whoever deletes it later may", func() {
		b := create("ca-kept", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem})
		ca := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(get(kopiaserver.CASecretName(b), ca)()).To(Succeed())
			g.Expect(ca.Finalizers).To(ContainElement(kopiaserver.FinalizerCAGuard))
		}).WithTimeout(reconciled).Should(Succeed())
		Expect(api.Client.Delete(ctx, b)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(get(kopiaserver.CASecretName(b), ca)()).To(Succeed())
			g.Expect(ca.Finalizers).NotTo(ContainElement(kopiaserver.FinalizerCAGuard))
		}).WithTimeout(reconciled).Should(Succeed())
		Expect(api.Client.Delete(ctx, ca)).To(Succeed())
		Eventually(get(kopiaserver.CASecretName(b), &corev1.Secret{})).WithTimeout(reconciled).ShouldNot(Succeed())
	})

	It("uses an admin's own TLS Secret as it is, giving guests its CA", func() {
		ca := adminTLSSecret("admin-tls", "own-tls.storage.svc")
		create("own-tls", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem, TLS: v1alpha1.TLSSpec{SecretName: "admin-tls"}})
		Eventually(condition("own-tls", v1alpha1.ConditionCertificateReady)).WithTimeout(reconciled).
			Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonCertificateIssued, "Secret admin-tls holds the server's certificate for own-tls.storage.svc from Secret admin-tls; guests trust its CA only"))
		Expect(bslsNamed("own-tls").Status.TLSCA).To(Equal(string(ca.CertPEM())))
		Expect(bslsNamed("own-tls").Status.TLSFingerprint).To(Equal(pki.Fingerprint(ca.Cert)))
		d := &appsv1.Deployment{}
		Eventually(get("own-tls-server", d)).WithTimeout(reconciled).Should(Succeed())
		Expect(d.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Secret.SecretName", "admin-tls")))
		Expect(get("own-tls-ca", &corev1.Secret{})()).NotTo(Succeed(), "no CA of the controller's own")
	})

	It("refuses an admin's TLS Secret whose certificate does not name the host guests dial", func() {
		adminTLSSecret("other-name-tls", "backup.example.com")
		create("other-name", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem, TLS: v1alpha1.TLSSpec{SecretName: "other-name-tls"}})
		Eventually(condition("other-name", v1alpha1.ConditionCertificateReady)).WithTimeout(reconciled).
			Should(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonTLSSecretInvalid, "tls.crt is not valid for other-name.storage.svc, the host guests connect to"))
		Expect(bslsNamed("other-name").Status.TLSCA).To(BeEmpty(), "guests are given no CA to trust for a server they would refuse")
		Expect(get("other-name-server", &appsv1.Deployment{})()).NotTo(Succeed(), "no server for a certificate guests refuse")
	})

	// What the Certificate says is in testdata/golden.
	It("asks cert-manager for a certificate, owned by the BSLS", func() {
		cert := &certmanagerv1.Certificate{}
		Eventually(get("pending-issuer-server", cert)).WithTimeout(reconciled).Should(Succeed())
		Expect(cert.OwnerReferences).To(ConsistOf(HaveField("Name", "pending-issuer")))
	})
})

// markAvailable records in a Deployment's status what the deployment
// controller would once its pod is ready: envtest runs no controllers, and
// the pod ran here, from that Deployment's template.
func markAvailable(ctx context.Context, api *testbed.APIServer, d *appsv1.Deployment) {
	GinkgoHelper()
	Eventually(func() error {
		cur := &appsv1.Deployment{}
		if err := api.Client.Get(ctx, client.ObjectKeyFromObject(d), cur); err != nil {
			return err
		}
		cur.Status = appsv1.DeploymentStatus{ObservedGeneration: cur.Generation, Replicas: 1, ReadyReplicas: 1, AvailableReplicas: 1, UpdatedReplicas: 1}
		return api.Client.Status().Update(ctx, cur)
	}).WithTimeout(10 * time.Second).Should(Succeed())
}
