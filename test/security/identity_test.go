package security

import (
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// Forged Secrets, and VM names too long for a label: identity comes from
// facts (the VM that controls its Secret), never from what a tenant writes
// into a Secret, and the webhook never takes over a Secret that is not its
// own.
var _ = Describe("A tenant who writes Secrets", Ordered, func() {
	const (
		storageNS = "identity-storage"
		aliceNS   = "identity-a" // alice's team: she may write any Secret here
		victimNS  = "identity-b" // the victim's team
		victim    = "db@" + victimNS
	)
	selector := map[string]string{"identity.security.test/backup": "allowed"}
	var (
		s          Server
		alice, bob *Tenant
		// alicePassword is the password alice puts in her forged Secrets.
		alicePassword = testbed.RandomPassword()
	)

	BeforeAll(func() {
		newNamespace(storageNS, nil)
		newNamespace(aliceNS, selector)
		newNamespace(victimNS, selector)
		alice = newTenant("identity-alice", aliceNS)
		bob = newTenant("identity-bob", victimNS)
		s = serveBSLS(bslsFor(storageNS, "main", selector, false))
	})

	// forge creates, as alice, a Secret named name in her namespace,
	// labelled as guestbackup's credential Secret of VM vm for the BSLS,
	// whose username key claims the victim's identity.
	forge := func(name, vm string) *corev1.Secret {
		GinkgoHelper()
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: aliceNS, Labels: map[string]string{
				v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, v1alpha1.LabelVM: vm,
				v1alpha1.LabelServerNamespace: storageNS, v1alpha1.LabelServerName: "main",
			}},
			Data: map[string][]byte{
				v1alpha1.SecretKeyUsername:   []byte(victim),
				v1alpha1.SecretKeyPassword:   []byte(alicePassword),
				v1alpha1.SecretKeyGeneration: []byte("1"),
			},
		}
		Expect(alice.Client.Create(ctx, secret)).To(Succeed())
		return secret
	}
	bslsEvents := func() []string {
		events, err := platform.Events(ctx, storageNS, "BackupStorageLocationServer", "main")
		Expect(err).NotTo(HaveOccurred())
		return events
	}
	// refused waits for the BSLS's refusal of Secret namespace/name, which
	// its reconciler records after writing the users Secrets it decided
	// on: from then on, what those Secrets say includes the refusal.
	refused := func(namespace, name, why string) {
		GinkgoHelper()
		Eventually(bslsEvents).WithTimeout(provisionTimeout).Should(ContainElement(
			"Warning UserRefused: Credential Secret "+namespace+"/"+name+" is not provisioned: "+why),
			"the BSLS says why %s/%s is refused", namespace, name)
	}

	It("cannot take the identity of a VM that does not exist yet", func() {
		forge("evil-guestbackup", "evil")
		refused(aliceNS, "evil-guestbackup", "VirtualMachine "+aliceNS+"/evil does not exist: a user is provisioned only for an existing VM that names this server")
		Expect(usersOf(s.BSLS, victim)).NotTo(ContainSubstring(victim+" "), "the users Secrets do not list %s", victim)
		_, err := loginAs(s, victim, alicePassword)
		Expect(err).To(refusedLogin(), "alice logs in as %s", victim)
	})

	It("cannot take the identity of a provisioned VM, nor cost it its user or snapshots", func() {
		By("bob's VM db, provisioned, with a snapshot of its database dump")
		createVM(bob.Client, victimNS, "db", storageNS+"/main")
		username, password := waitProvisioned(s, victimNS, "db")
		Expect(username).To(Equal(victim))
		dump := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(dump, "dump.sql"), []byte("the victim's database"), 0o600)).To(Succeed())
		kopia, err := loginAs(s, username, password)
		Expect(err).NotTo(HaveOccurred())
		out, err := kopia.Run(ctx, "snapshot", "create", dump)
		Expect(err).NotTo(HaveOccurred(), out)
		snapshots, err := kopia.SnapshotIDs(ctx, dump)
		Expect(err).NotTo(HaveOccurred())
		Expect(snapshots).To(HaveLen(1))

		By("alice forging Secrets that claim db's identity: under another name, and under db's own name in her namespace")
		forge("evil2-guestbackup", "db")
		forge("db-guestbackup", "db")
		refused(aliceNS, "evil2-guestbackup", "its label guestbackup.io/vm=db names VirtualMachine db, whose credential Secret can only be db-guestbackup")
		refused(aliceNS, "db-guestbackup", "VirtualMachine "+aliceNS+"/db does not exist: a user is provisioned only for an existing VM that names this server")

		By("db keeping its user, its password and its snapshots")
		Expect(usersOf(s.BSLS, victim)).To(ContainSubstring(victim+" "), "the users Secrets still list %s", victim)
		Expect(bslsEvents()).NotTo(ContainElement(ContainSubstring(victimNS+"/db-guestbackup is not provisioned")), "db's own Secret is never refused")
		kopia, err = loginAs(s, username, password)
		Expect(err).NotTo(HaveOccurred(), "db logs in after the forgeries")
		Expect(kopia.SnapshotIDs(ctx, dump)).To(Equal(snapshots), "db's snapshots are intact")

		By("alice's login as db being refused")
		_, err = loginAs(s, victim, alicePassword)
		Expect(err).To(refusedLogin())
	})

	It("cannot change a VM's credentials with a CREATE of its name, which the API server refuses", func() {
		By("a second server the namespace may use, which the CREATE names")
		serveBSLS(bslsFor(storageNS, "second", selector, false))
		key := types.NamespacedName{Namespace: victimNS, Name: v1alpha1.CredentialSecretName("db")}
		before := &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, key, before)).To(Succeed())

		err := bob.Client.Create(ctx, vmFor(victimNS, "db", storageNS+"/second"))
		Expect(apierrors.IsForbidden(err) || apierrors.IsAlreadyExists(err)).To(BeTrue(), "the CREATE is refused: %v", err)
		refusal := err

		after := &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, key, after)).To(Succeed())
		Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "the Secret was never written")
		Expect(after.Labels).To(Equal(before.Labels), "the Secret still names db's server")
		_, err = loginAs(s, victim, string(before.Data[v1alpha1.SecretKeyPassword]))
		Expect(err).NotTo(HaveOccurred(), "db logs in with the password its guest holds")
		Expect(refusal).To(MatchError(ContainSubstring("VirtualMachine " + victimNS + "/db already exists: a CREATE cannot replace it, and guestbackup leaves its credentials as they are")))
	})

	It("cannot make the webhook overwrite an unrelated Secret that bears a VM's Secret name", func() {
		own := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "web-guestbackup", Namespace: aliceNS, Labels: map[string]string{"app": "web"}},
			Data:       map[string][]byte{"token": []byte("alice's own token")},
		}
		Expect(alice.Client.Create(ctx, own)).To(Succeed())
		before := &corev1.Secret{}
		Expect(alice.Client.Get(ctx, client.ObjectKeyFromObject(own), before)).To(Succeed())

		err := alice.Client.Create(ctx, vmFor(aliceNS, "web", storageNS+"/main"))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the admission is denied: %v", err)
		Expect(err).To(MatchError(ContainSubstring("Secret " + aliceNS + "/web-guestbackup already exists and is not guestbackup's credential Secret for VirtualMachine web (it is not labelled app.kubernetes.io/managed-by=guestbackup): guestbackup keeps this VM's credentials in a Secret of that name and never overwrites another; rename or delete that Secret")))

		after := &corev1.Secret{}
		Expect(alice.Client.Get(ctx, client.ObjectKeyFromObject(own), after)).To(Succeed())
		Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "the Secret was never written")
		Expect(after.Data).To(Equal(before.Data))
		Expect(after.Labels).To(Equal(before.Labels))
		Expect(after.OwnerReferences).To(BeEmpty())
	})

	It("gets a clear denial for a VM whose name cannot label its Secret", func() {
		name := strings.Repeat("v", 64)
		err := alice.Client.Create(ctx, vmFor(aliceNS, name, storageNS+"/main"))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the admission is denied, not failed: %v", err)
		Expect(err).To(MatchError(ContainSubstring("VirtualMachine " + aliceNS + "/" + name + " cannot get guestbackup credentials: its name (64 characters) cannot label its credential Secret (guestbackup.io/vm=<name>): must be no more than 63 characters")))
		Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: aliceNS, Name: name + "-guestbackup"}, &corev1.Secret{})).
			To(Satisfy(apierrors.IsNotFound), "no Secret was written")
	})
})
