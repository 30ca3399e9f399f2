package kopiaserver_test

import (
	"context"
	"encoding/json"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// The CA guests trust survives the deletion of its Secret, and
// nothing a tenant writes can put another CA in its place.
var _ = Describe("The CA guard", Ordered, func() {
	const ns = "guarded"
	var (
		ctx  context.Context
		api  *testbed.APIServer
		stop func() error
		// tenant may create and read Secrets in ns, as a namespace's
		// owner may, and nothing more.
		tenant client.Client
	)
	get := func(name string, obj client.Object) func() error {
		return func() error { return api.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj) }
	}
	pinOf := func(name string) func() string {
		return func() string {
			b := &v1alpha1.BackupStorageLocationServer{}
			if err := get(name, b)(); err != nil {
				return ""
			}
			return b.Status.TLSFingerprint
		}
	}
	events := func(name string) func() []string { return bslsEvents(ctx, api, ns, name) }
	filesystem := v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}
	createWith := func(name string, spec v1alpha1.BackupStorageLocationServerSpec) *v1alpha1.BackupStorageLocationServer {
		GinkgoHelper()
		b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
		Expect(api.Client.Create(ctx, b)).To(Succeed())
		Eventually(pinOf(name)).WithTimeout(reconciled).Should(HaveLen(64))
		return b
	}
	create := func(name string) *v1alpha1.BackupStorageLocationServer {
		GinkgoHelper()
		return createWith(name, v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem})
	}
	// withAdminPassword is a BSLS whose repository password the admin
	// wrote: its CA's key is random, not derived from it.
	withAdminPassword := func(name string) *v1alpha1.BackupStorageLocationServer {
		GinkgoHelper()
		Expect(api.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-admins-password", Namespace: ns},
			Data:       map[string][]byte{"password": []byte("chosen by a person, long or not")},
		})).To(Succeed())
		return createWith(name, v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem, Repository: v1alpha1.RepositorySpec{
			PasswordSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name + "-admins-password"}, Key: "password"},
		}})
	}
	// sameKeyPair reports whether two CA Secrets hold the same certificate
	// and key.
	sameKeyPair := func(g Gomega, a, b *corev1.Secret) {
		g.Expect(a.Data[corev1.TLSCertKey]).To(Equal(b.Data[corev1.TLSCertKey]), "the certificate guests pin")
		ka, err := pki.ParseCA(a.Data[corev1.TLSCertKey], a.Data[corev1.TLSPrivateKeyKey])
		g.Expect(err).NotTo(HaveOccurred())
		kb, err := pki.ParseCA(b.Data[corev1.TLSCertKey], b.Data[corev1.TLSPrivateKeyKey])
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(ka.Key.Equal(kb.Key)).To(BeTrue(), "its key")
	}
	// nudge makes the controller look at every BSLS now: the Secrets
	// below are not guestbackup's, so no watch reports them.
	nudge := func(why string) {
		GinkgoHelper()
		Eventually(func() error {
			n := &corev1.Namespace{}
			if err := api.Client.Get(ctx, types.NamespacedName{Name: ns}, n); err != nil {
				return err
			}
			n.Labels = map[string]string{"nudge": why}
			return api.Client.Update(ctx, n)
		}).WithTimeout(reconciled).Should(Succeed())
	}
	// labelledRescue is a Secret <name>-ca-rescue with guestbackup's
	// labels, as the controller makes one during a restore (here holding
	// nothing of use, so that the guard of a live BSLS leaves it).
	labelledRescue := func(name string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-ca-rescue", Namespace: ns, Labels: kopiaserver.Labels(&v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: name}})},
			Data:       map[string][]byte{"secret": []byte("{}")},
		}
	}
	start := func() {
		GinkgoHelper()
		var err error
		stop, err = runController(api, testbed.ManagerOptions{Logger: GinkgoLogr})
		Expect(err).NotTo(HaveOccurred())
	}

	BeforeAll(func() {
		ctx = context.Background()
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
		for _, n := range []string{ns, controllerNamespace} {
			Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})).To(Succeed())
		}
		Expect(api.Client.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "get", "list"}}},
		})).To(Succeed())
		Expect(api.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "tenant"}},
		})).To(Succeed())
		cfg := rest.CopyConfig(api.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "tenant"}
		var err error
		tenant, err = client.New(cfg, client.Options{Scheme: api.Scheme})
		Expect(err).NotTo(HaveOccurred())
		start()
		DeferCleanup(func() {
			if stop != nil {
				Expect(stop()).To(Succeed())
			}
		})
	})

	It("does not let a tenant's <bsls>-ca-rescue Secret replace the BSLS's CA", func() {
		b := create("main")
		pin := pinOf("main")()
		ca := &corev1.Secret{}
		Expect(get(kopiaserver.CASecretName(b), ca)()).To(Succeed())
		before := ca.DeepCopy()

		By("creating, as the tenant, a rescue copy of a CA of the tenant's own")
		other, err := pki.NewCA("the tenant's CA", 24*time.Hour)
		Expect(err).NotTo(HaveOccurred())
		otherKey, err := other.KeyPEM()
		Expect(err).NotTo(HaveOccurred())
		forged := corev1.Secret{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: kopiaserver.CASecretName(b), Namespace: ns},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: other.CertPEM(), corev1.TLSPrivateKeyKey: otherKey, "ca.crt": other.CertPEM()},
		}
		raw, err := json.Marshal(forged)
		Expect(err).NotTo(HaveOccurred())
		Expect(tenant.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: kopiaserver.CARescueSecretName(b), Namespace: ns},
			Data:       map[string][]byte{"secret": raw},
		})).To(Succeed())
		nudge("forged-rescue")

		By("the controller refusing it, and saying so, while the CA and the guests' pin stay")
		Eventually(events("main")).WithTimeout(reconciled).Should(ContainElement(Or(
			HavePrefix("Warning "+kopiaserver.ReasonCARescueIgnored+": "),
			HavePrefix("Warning "+kopiaserver.ReasonCAChanged+": "))))
		Expect(events("main")()).NotTo(ContainElement(HavePrefix("Warning "+kopiaserver.ReasonCAChanged+": ")), "the guests' CA was replaced by the tenant's")
		Expect(pinOf("main")()).To(Equal(pin))
		now := &corev1.Secret{}
		Expect(get(kopiaserver.CASecretName(b), now)()).To(Succeed())
		Expect(now.Data[corev1.TLSCertKey]).To(Equal(before.Data[corev1.TLSCertKey]))
		Expect(now.Data[corev1.TLSPrivateKeyKey]).To(Equal(before.Data[corev1.TLSPrivateKeyKey]))
		Expect(events("main")()).To(ContainElement(And(
			HavePrefix("Warning "+kopiaserver.ReasonCARescueIgnored+": Secret "+ns+"/main-ca-rescue"),
			ContainSubstring("not labelled"))))
	})

	// A CA Secret guests do not trust (here: corrupt, TLSSecretInvalid) is
	// not kept through its deletion, even one not marked as a replacement:
	// its copy could never be restored, and the deletion would hang. What
	// takes its place depends on where the CA's key comes from.
	corrupt := func(b *v1alpha1.BackupStorageLocationServer) (pin string) {
		GinkgoHelper()
		pin = pinOf(b.Name)()
		ca := &corev1.Secret{}
		Expect(get(kopiaserver.CASecretName(b), ca)()).To(Succeed())

		By("corrupting the CA Secret, as a bad edit would")
		ca.Data[corev1.TLSCertKey] = []byte("not a certificate")
		Expect(api.Client.Update(ctx, ca)).To(Succeed())
		nudge("corrupt-" + b.Name)
		Eventually(func(g Gomega) {
			now := &v1alpha1.BackupStorageLocationServer{}
			g.Expect(get(b.Name, now)()).To(Succeed())
			c := meta.FindStatusCondition(now.Status.Conditions, v1alpha1.ConditionCertificateReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(kopiaserver.ReasonTLSSecretInvalid))
		}).WithTimeout(reconciled).Should(Succeed())

		By("deleting it, as TLSSecretInvalid suggests")
		Expect(api.Client.Delete(ctx, ca)).To(Succeed())
		Eventually(func(g Gomega) {
			now := &corev1.Secret{}
			g.Expect(get(kopiaserver.CASecretName(b), now)()).To(Succeed())
			g.Expect(now.UID).NotTo(Equal(ca.UID), "the corrupt Secret is gone, not held terminating")
			g.Expect(now.DeletionTimestamp).To(BeNil())
			g.Expect(now.Finalizers).To(ContainElement(kopiaserver.FinalizerCAGuard), "the new CA is guarded in turn")
		}).WithTimeout(reconciled).Should(Succeed())
		Eventually(events(b.Name)).WithTimeout(reconciled).Should(ContainElement(
			HavePrefix("Warning " + kopiaserver.ReasonCASecretNotKept + ": Secret " + ns + "/" + b.Name + "-ca was deleted")))
		Expect(get(kopiaserver.CARescueSecretName(b), &corev1.Secret{})()).NotTo(Succeed(), "no copy of a CA nobody trusts")
		return pin
	}

	It("lets a corrupt <bsls>-ca the admin deletes go, and issues a new CA when the admin chose the repository password", func() {
		b := withAdminPassword("corrupt")
		pin := corrupt(b)
		Eventually(pinOf(b.Name)).WithTimeout(reconciled).Should(And(HaveLen(64), Not(Equal(pin))), "a new CA is issued")
		Eventually(events(b.Name)).WithTimeout(reconciled).Should(ContainElement(And(
			HavePrefix("Normal "+kopiaserver.ReasonCAIssued), ContainSubstring("with a random key"))))
	})

	It("lets a corrupt <bsls>-ca the admin deletes go, and makes the CA guests trust again from the password the controller generated", func() {
		b := create("corrupt-derived")
		kept := &corev1.Secret{}
		Expect(get(kopiaserver.CASecretName(b), kept)()).To(Succeed())
		pin := corrupt(b)
		Eventually(func(g Gomega) {
			now := &corev1.Secret{}
			g.Expect(get(kopiaserver.CASecretName(b), now)()).To(Succeed())
			sameKeyPair(g, now, kept)
		}).WithTimeout(reconciled).Should(Succeed())
		Expect(pinOf(b.Name)()).To(Equal(pin), "the pin holds")
		Eventually(events(b.Name)).WithTimeout(reconciled).Should(ContainElement(And(
			HavePrefix("Warning "+kopiaserver.ReasonCASecretRemade+": Secret corrupt-derived-ca was missing"), ContainSubstring(pin))))
	})

	// The guard sees every deletion it can. One it cannot (its finalizer
	// removed by hand while no controller runs, an etcd restore) loses the
	// Secret; a key derived from the repository password is made again,
	// and the certificate guests pin with it.
	It("makes the CA guests trust again from the repository password when its Secret is lost beyond the guard", func() {
		b := create("lost")
		pin := pinOf("lost")()
		ca := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(get(kopiaserver.CASecretName(b), ca)()).To(Succeed())
			g.Expect(ca.Finalizers).To(ContainElement(kopiaserver.FinalizerCAGuard))
		}).WithTimeout(reconciled).Should(Succeed())

		By("stopping the controller, removing the guard's finalizer by hand and deleting the Secret")
		Expect(stop()).To(Succeed())
		stop = nil
		patch := client.MergeFrom(ca.DeepCopy())
		ca.Finalizers = nil
		Expect(api.Client.Patch(ctx, ca, patch)).To(Succeed())
		Expect(api.Client.Delete(ctx, ca)).To(Succeed())
		Eventually(get(kopiaserver.CASecretName(b), &corev1.Secret{})).WithTimeout(reconciled).ShouldNot(Succeed())

		By("starting the controller again")
		start()
		Eventually(func(g Gomega) {
			now := &corev1.Secret{}
			g.Expect(get(kopiaserver.CASecretName(b), now)()).To(Succeed())
			g.Expect(now.UID).NotTo(Equal(ca.UID))
			sameKeyPair(g, now, ca)
		}).WithTimeout(reconciled).Should(Succeed())
		Expect(pinOf("lost")()).To(Equal(pin), "the pin holds")
		Eventually(events("lost")).WithTimeout(reconciled).Should(ContainElement(And(
			HavePrefix("Warning "+kopiaserver.ReasonCASecretRemade+": Secret lost-ca was missing"), ContainSubstring(pin))))
		Expect(events("lost")()).NotTo(ContainElement(HavePrefix("Warning "+kopiaserver.ReasonCAChanged)), "the CA did not change")
	})

	It("deletes the BSLS's CA rescue Secret with the BSLS: no copy of the CA key is left behind", func() {
		b := create("doomed")
		Expect(api.Client.Create(ctx, labelledRescue("doomed"))).To(Succeed())
		nudge("doomed-rescue")
		Eventually(events("doomed")).WithTimeout(reconciled).Should(ContainElement(
			HavePrefix("Warning " + kopiaserver.ReasonCARescueIgnored + ": Secret " + ns + "/doomed-ca-rescue")))

		Expect(api.Client.Delete(ctx, b)).To(Succeed())
		Eventually(get("doomed", &v1alpha1.BackupStorageLocationServer{})).WithTimeout(reconciled).ShouldNot(Succeed())
		Eventually(get("doomed-ca-rescue", &corev1.Secret{})).WithTimeout(reconciled).ShouldNot(Succeed(), "the rescue went with its BSLS")
		Expect(get("doomed-ca", &corev1.Secret{})()).To(Succeed(), "the CA Secret outlives its BSLS")
	})

	It("releases the CA Secret of a BSLS deleted while the controller is stopped, so that the Secret, and its namespace, can be deleted", func() {
		hasGuard := func(obj client.Object) bool {
			for _, f := range obj.GetFinalizers() {
				if f == kopiaserver.FinalizerCAGuard {
					return true
				}
			}
			return false
		}
		guarded := func(name string) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				b := &v1alpha1.BackupStorageLocationServer{}
				g.Expect(get(name, b)()).To(Succeed())
				g.Expect(hasGuard(b)).To(BeTrue(), "the BSLS waits for its CA Secret's release")
				ca := &corev1.Secret{}
				g.Expect(get(name+"-ca", ca)()).To(Succeed())
				g.Expect(hasGuard(ca)).To(BeTrue())
			}).WithTimeout(reconciled).Should(Succeed())
		}
		create("gone")
		guarded("gone")
		// As an earlier release left a BSLS: its CA Secret guarded, the
		// BSLS itself without a finalizer.
		create("legacy")
		guarded("legacy")

		By("stopping the controller, and deleting both BSLSs meanwhile")
		Expect(stop()).To(Succeed())
		stop = nil
		legacy := &v1alpha1.BackupStorageLocationServer{}
		Expect(get("legacy", legacy)()).To(Succeed())
		patch := client.MergeFrom(legacy.DeepCopy())
		legacy.Finalizers = nil
		Expect(api.Client.Patch(ctx, legacy, patch)).To(Succeed())
		for _, name := range []string{"gone", "legacy"} {
			Expect(api.Client.Delete(ctx, &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})).To(Succeed())
		}
		Eventually(get("legacy", &v1alpha1.BackupStorageLocationServer{})).WithTimeout(reconciled).ShouldNot(Succeed(), "no finalizer: gone at once")
		gone := &v1alpha1.BackupStorageLocationServer{}
		Expect(get("gone", gone)()).To(Succeed())
		Expect(gone.DeletionTimestamp).NotTo(BeNil(), "its deletion waits for a controller to release its CA Secret")
		// As a restore interrupted by the deletion leaves them.
		for _, name := range []string{"gone", "legacy"} {
			Expect(api.Client.Create(ctx, labelledRescue(name))).To(Succeed())
		}

		By("starting the controller again")
		start()
		Eventually(get("gone", &v1alpha1.BackupStorageLocationServer{})).WithTimeout(reconciled).ShouldNot(Succeed())
		for _, name := range []string{"gone-ca-rescue", "legacy-ca-rescue"} {
			Eventually(get(name, &corev1.Secret{})).WithTimeout(reconciled).ShouldNot(Succeed(), "no copy of the CA key outlives its BSLS")
		}
		for _, name := range []string{"gone-ca", "legacy-ca"} {
			Eventually(func(g Gomega) {
				ca := &corev1.Secret{}
				g.Expect(get(name, ca)()).To(Succeed(), "the CA Secret outlives its BSLS")
				g.Expect(hasGuard(ca)).To(BeFalse())
			}).WithTimeout(reconciled).Should(Succeed())
			Expect(api.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})).To(Succeed())
			Eventually(get(name, &corev1.Secret{})).WithTimeout(reconciled).ShouldNot(Succeed(), "deleted, not held")
		}
	})
})
