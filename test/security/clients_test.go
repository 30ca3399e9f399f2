package security

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// Workloads that are not VMs (a CronJob that dumps a database, a sidecar)
// opt in with a BackupClient (docs/clients.md), and get a Kopia identity of
// their own by the rules VMs have: from facts, never a VM's, with explicit
// ACLs, append-only, rotation and revocation. The client here is the test
// bed's kopia, run with nothing but what the issued Secret holds, the way a
// pod runs it: the connect line through a shell, the password in
// KOPIA_PASSWORD, the CA in SSL_CERT_FILE.
var _ = Describe("A workload with a BackupClient", Ordered, func() {
	const (
		storageNS = "clients-storage"
		teamNS    = "clients-team"    // admitted: the team's VMs and workloads
		outsideNS = "clients-outside" // not admitted by the server
	)
	selector := map[string]string{"clients.security.test/backup": "allowed"}
	var (
		s             Server
		team, outside *Tenant
	)

	BeforeAll(func() {
		newNamespace(storageNS, nil)
		newNamespace(teamNS, selector)
		newNamespace(outsideNS, nil)
		team = newTenant("clients-team", teamNS)
		outside = newTenant("clients-outside", outsideNS)
		for _, t := range []*Tenant{team, outside} {
			allowBackupClients(t)
		}
		s = serveBSLS(bslsFor(storageNS, "main", selector, true))
	})

	server := v1alpha1.ServerReference{Namespace: storageNS, Name: "main"}
	events := func(namespace, name string) func() []string {
		return func() []string {
			e, err := platform.Events(ctx, namespace, "BackupClient", name)
			Expect(err).NotTo(HaveOccurred())
			return e
		}
	}

	It("snapshots and restores with the issued Secret, as its own identity, and cannot delete its snapshots", func() {
		createClient(team, teamNS, "dbdump", server, "")
		c := waitClientReady(teamNS, "dbdump")
		Expect(c.Status.Identity).To(Equal("dbdump@" + teamNS + ".client"))
		// The recorder sends Events on its own, after the status it
		// decided with: Ready may be read before they are stored.
		Eventually(events(teamNS, "dbdump")).WithTimeout(provisionTimeout).Should(ContainElements(
			HavePrefix("Normal CredentialsIssued: Credentials of dbdump@"+teamNS+".client"),
			HavePrefix("Normal UserProvisioned: User dbdump@"+teamNS+".client is provisioned")))

		secret := clientSecret(team, teamNS, "dbdump-backupclient")
		Expect(metav1.IsControlledBy(secret, c)).To(BeTrue(), "the Secret goes with its BackupClient")
		Expect(string(secret.Data[clientsecret.KeyConnect])).NotTo(ContainSubstring(string(secret.Data[clientsecret.KeyPassword])), "the connect line carries no password")
		kopia := connectWithSecret(secret)

		dir := guestSnapshot(kopia, "the shop's database dump\n")
		ids, err := kopia.SnapshotIDs(ctx, dir)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))
		out, err := kopia.Run(ctx, "snapshot", "list", "--all")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("dbdump@"+teamNS+".client:"+dir), "the snapshot carries the client's identity")

		By("the snapshot reaching the BackupClient's status and Events, as a VM's does")
		Eventually(func() *v1alpha1.GuestSnapshotSummary {
			Expect(team.Client.Get(ctx, types.NamespacedName{Namespace: teamNS, Name: "dbdump"}, c)).To(Succeed())
			return c.Status.LastSnapshot
		}).WithTimeout(provisionTimeout).Should(And(Not(BeNil()), HaveField("ID", ids[0]), HaveField("Path", dir)))
		Expect(c.Status.Snapshots).To(BeEquivalentTo(1))
		Eventually(events(teamNS, "dbdump")).WithTimeout(provisionTimeout).Should(ContainElement(
			HavePrefix("Normal SnapshotCreated: Snapshot " + ids[0] + " of " + dir + ":")))

		restored := filepath.Join(GinkgoT().TempDir(), "restored")
		out, err = kopia.Run(ctx, "snapshot", "restore", ids[0], restored)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(os.ReadFile(filepath.Join(restored, "data.txt"))).To(Equal([]byte("the shop's database dump\n")))

		By("the append-only server refusing the client's deletion of its own snapshot")
		out, err = kopia.Run(ctx, "snapshot", "delete", ids[0], "--delete")
		Expect(err).To(HaveOccurred(), "the client deleted its snapshot on an append-only server: %s", out)
		Expect(kopia.SnapshotIDs(ctx, dir)).To(Equal(ids))
	})

	It("rotates: the old password stops authenticating, the new one logs in", func() {
		before := clientSecret(team, teamNS, "dbdump-backupclient")
		username := string(before.Data[clientsecret.KeyUsername]) + "@" + string(before.Data[clientsecret.KeyHostname])
		held := guestOpen(s, username, string(before.Data[clientsecret.KeyPassword]))
		Expect(heldReads(held)()).To(Succeed())

		c := &v1alpha1.BackupClient{}
		Expect(team.Client.Get(ctx, types.NamespacedName{Namespace: teamNS, Name: "dbdump"}, c)).To(Succeed())
		patch := client.MergeFrom(c.DeepCopy())
		c.Spec.Rotate = "leaked"
		Expect(team.Client.Patch(ctx, c, patch)).To(Succeed())

		var after *corev1.Secret
		Eventually(func() string {
			after = clientSecret(team, teamNS, "dbdump-backupclient")
			return string(after.Data[clientsecret.KeyGeneration])
		}).WithTimeout(provisionTimeout).Should(Equal("2"))
		Expect(after.Data[clientsecret.KeyPassword]).NotTo(Equal(before.Data[clientsecret.KeyPassword]))
		waitClientReady(teamNS, "dbdump")
		Eventually(events(teamNS, "dbdump")).WithTimeout(provisionTimeout).Should(ContainElement(HavePrefix("Normal CredentialsRotated: Credentials of dbdump@" + teamNS + ".client rotated from generation 1 to 2")))

		Eventually(heldReads(held)).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(HaveOccurred(),
			"a session opened with the old password still reads the repository")
		_, err := loginAs(s, username, string(before.Data[clientsecret.KeyPassword]))
		Expect(err).To(refusedLogin(), "the old password still logs in")
		connectWithSecret(after)
	})

	It("is revoked when its BackupClient goes: its user leaves the server and its sessions end", func() {
		secret := clientSecret(team, teamNS, "dbdump-backupclient")
		username := string(secret.Data[clientsecret.KeyUsername]) + "@" + string(secret.Data[clientsecret.KeyHostname])
		password := string(secret.Data[clientsecret.KeyPassword])
		held := guestOpen(s, username, password)
		Expect(heldReads(held)()).To(Succeed())

		Expect(team.Client.Delete(ctx, &v1alpha1.BackupClient{ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "dbdump"}})).To(Succeed())
		Eventually(func() string { return usersOf(s.BSLS, username) }).WithTimeout(provisionTimeout).
			ShouldNot(ContainSubstring(username+" "), "the users Secrets still list %s", username)
		Eventually(heldReads(held)).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(HaveOccurred(),
			"a session of the deleted client still reads the repository")
		Eventually(func() error { _, err := loginAs(s, username, password); return err }).
			WithTimeout(guestACLSyncTimeout).WithPolling(2 * time.Second).Should(refusedLogin())
	})

	It("named as a VM of its namespace, takes neither the VM's identity, nor its Secret, nor its snapshots", func() {
		By("the team's VM db, provisioned, with a snapshot")
		createVM(team.Client, teamNS, "db", server.String())
		vmUser, vmPassword := waitProvisioned(s, teamNS, "db")
		vmClient, err := loginAs(s, vmUser, vmPassword)
		Expect(err).NotTo(HaveOccurred())
		vmDir := guestSnapshot(vmClient, "the VM's files\n")
		vmSnapshots, err := vmClient.SnapshotIDs(ctx, vmDir)
		Expect(err).NotTo(HaveOccurred())
		vmSecretKey := types.NamespacedName{Namespace: teamNS, Name: v1alpha1.CredentialSecretName("db")}
		vmSecret := &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, vmSecretKey, vmSecret)).To(Succeed())

		By("a BackupClient db, and one that names the VM's Secret as its own")
		createClient(team, teamNS, "db", server, "")
		createClient(team, teamNS, "grabber", server, v1alpha1.CredentialSecretName("db"))
		c := waitClientReady(teamNS, "db")
		Expect(c.Status.Identity).To(Equal("db@" + teamNS + ".client"))
		Eventually(events(teamNS, "grabber")).WithTimeout(provisionTimeout).Should(ContainElement(
			HavePrefix("Warning SecretConflict: Secret db-guestbackup exists and is not this BackupClient's (controlled by VirtualMachine db)")))

		By("the VM keeping its Secret, its login and its snapshots")
		after := &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, vmSecretKey, after)).To(Succeed())
		// The controller's VM reconciler writes it too (adoption,
		// announcements): what the VM's credentials are, and whose, is
		// what must not change.
		Expect(after.Data[v1alpha1.SecretKeyPassword]).To(Equal(vmSecret.Data[v1alpha1.SecretKeyPassword]), "the VM's password changed")
		Expect(after.Data[v1alpha1.SecretKeyGeneration]).To(Equal(vmSecret.Data[v1alpha1.SecretKeyGeneration]))
		Expect(after.Labels).NotTo(HaveKey(clientsecret.LabelClient), "the VM's Secret was relabelled for a client")
		Expect(metav1.GetControllerOf(after)).To(HaveField("Kind", "VirtualMachine"), "the VM's Secret changed hands")
		Expect(usersOf(s.BSLS, vmUser)).To(ContainSubstring(vmUser + " "))
		vmClient, err = loginAs(s, vmUser, vmPassword)
		Expect(err).NotTo(HaveOccurred(), "the VM logs in with its own password")
		Expect(vmClient.SnapshotIDs(ctx, vmDir)).To(Equal(vmSnapshots))

		By("the client db seeing none of the VM's snapshots, and its password opening no VM login")
		secret := clientSecret(team, teamNS, "db-backupclient")
		kopia := connectWithSecret(secret)
		out, err := kopia.Run(ctx, "snapshot", "list", "--all")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).NotTo(ContainSubstring(vmDir), "the client lists the VM's snapshots")
		out, err = kopia.Run(ctx, "snapshot", "restore", vmSnapshots[0], filepath.Join(GinkgoT().TempDir(), "stolen"))
		Expect(err).To(HaveOccurred(), "the client restored the VM's snapshot: %s", out)
		_, err = loginAs(s, vmUser, string(secret.Data[clientsecret.KeyPassword]))
		Expect(err).To(refusedLogin(), "the client's password logs in as the VM")
	})

	// A host outside the cluster is a BackupClient its server's admin
	// declares in the server's namespace, with the hash of a password of
	// their own, which the real kopia CLI computes (`kopia server user
	// hash-password`): the cluster never holds the password.
	It("declared by the server's admin with a password of their own, is a host: it logs in with it, rotates by a new hash, appends only, and is revoked when it goes", func() {
		admin, err := platform.Repository(ctx, GinkgoT(), s.BSLS)
		Expect(err).NotTo(HaveOccurred())
		hashOf := func(password string) []byte {
			GinkgoHelper()
			out, err := admin.Run(ctx, "server", "user", "hash-password", "--user-password="+password)
			Expect(err).NotTo(HaveOccurred(), out)
			return []byte(strings.TrimSpace(out))
		}
		first := testbed.RandomPassword()
		hashSecret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: storageNS, Name: "db01-password-hash"},
			Data:       map[string][]byte{"passwordHash": hashOf(first)},
		}
		Expect(platform.API.Client.Create(ctx, hashSecret)).To(Succeed())
		Expect(platform.API.Client.Create(ctx, &v1alpha1.BackupClient{
			ObjectMeta: metav1.ObjectMeta{Namespace: storageNS, Name: "db01"},
			Spec:       v1alpha1.BackupClientSpec{Server: server, PasswordHash: &v1alpha1.PasswordHashSource{SecretName: hashSecret.Name}},
		})).To(Succeed())
		c := waitClientReady(storageNS, "db01")
		Expect(c.Status.Identity).To(Equal("db01@" + storageNS + ".client"))
		Eventually(events(storageNS, "db01")).WithTimeout(provisionTimeout).Should(ContainElement(
			HavePrefix("Normal CredentialsIssued: Credentials of db01@" + storageNS + ".client for BackupStorageLocationServer " + server.String() + " (generation 1, the password hash of Secret db01-password-hash)")))
		secret := &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: storageNS, Name: "db01-backupclient"}, secret)).To(Succeed())
		Expect(secret.Data).NotTo(HaveKey(clientsecret.KeyPassword), "the cluster holds the host's password")

		By("the host's kopia connecting with the connect line and the admin's own password")
		connect := func(password string) *testbed.KopiaClient {
			GinkgoHelper()
			return connectWithSecret(secret, password)
		}
		kopia := connect(first)
		dir := guestSnapshot(kopia, "the host's /etc\n")
		ids, err := kopia.SnapshotIDs(ctx, dir)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))
		out, err := kopia.Run(ctx, "snapshot", "delete", ids[0], "--delete")
		Expect(err).To(HaveOccurred(), "the host deleted its snapshot on an append-only server: %s", out)

		By("the admin writing a new hash, and saying so with spec.rotate: the old password stops, the new one logs in")
		username := c.Status.Identity
		held := guestOpen(s, username, first)
		Expect(heldReads(held)()).To(Succeed())
		second := testbed.RandomPassword()
		hashSecret.Data["passwordHash"] = hashOf(second)
		Expect(platform.API.Client.Update(ctx, hashSecret)).To(Succeed())
		patch := client.MergeFrom(c.DeepCopy())
		c.Spec.Rotate = "2026-12"
		Expect(platform.API.Client.Patch(ctx, c, patch)).To(Succeed())
		Eventually(events(storageNS, "db01")).WithTimeout(provisionTimeout).Should(ContainElement(
			HavePrefix("Normal CredentialsRotated: Credentials of db01@" + storageNS + ".client rotated from generation 1 to 2 (the password hash of Secret db01-password-hash changed)")))
		Eventually(heldReads(held)).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(HaveOccurred(),
			"a session opened with the old password still reads the repository")
		_, err = loginAs(s, username, first)
		Expect(err).To(refusedLogin(), "the old password still logs in")
		connect(second)

		By("deleting the BackupClient revoking the host")
		Expect(platform.API.Client.Delete(ctx, c)).To(Succeed())
		Eventually(func() string { return usersOf(s.BSLS, username) }).WithTimeout(provisionTimeout).
			ShouldNot(ContainSubstring(username+" "), "the users Secrets still list %s", username)
		Eventually(func() error { _, err := loginAs(s, username, second); return err }).
			WithTimeout(guestACLSyncTimeout).WithPolling(2 * time.Second).Should(refusedLogin())
	})

	It("cannot be declared a host by a tenant: not in the server's namespace, nor with a password of its own in the tenant's", func() {
		err := team.Client.Create(ctx, &v1alpha1.BackupClient{
			ObjectMeta: metav1.ObjectMeta{Namespace: storageNS, Name: "mine"},
			Spec:       v1alpha1.BackupClientSpec{Server: server},
		})
		Expect(err).To(MatchError(ContainSubstring("forbidden")), "a tenant declared a client in the server's namespace")

		password := testbed.RandomPassword()
		h, err := identity.NewHash(password, identity.Scrypt)
		Expect(err).NotTo(HaveOccurred())
		Expect(team.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "mine-hash"},
			Data:       map[string][]byte{"passwordHash": []byte(h.String())},
		})).To(Succeed())
		Expect(team.Client.Create(ctx, &v1alpha1.BackupClient{
			ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "mine"},
			Spec:       v1alpha1.BackupClientSpec{Server: server, PasswordHash: &v1alpha1.PasswordHashSource{SecretName: "mine-hash"}},
		})).To(Succeed())
		Eventually(events(teamNS, "mine")).WithTimeout(provisionTimeout).Should(ContainElement(
			HavePrefix("Warning PasswordHashNotAllowed: spec.passwordHash declares a client whose password only its admin knows, which only the admin of BackupStorageLocationServer " + server.String() + " does")))
		username := "mine@" + teamNS + ".client"
		Consistently(func() string { return usersOf(s.BSLS, username) }).WithTimeout(3*time.Second).
			ShouldNot(ContainSubstring(username+" "), "the users Secrets list %s", username)
		Expect(team.Client.Get(ctx, types.NamespacedName{Namespace: teamNS, Name: "mine-backupclient"}, &corev1.Secret{})).To(MatchError(ContainSubstring("not found")))
		_, err = loginAs(s, username, password)
		Expect(err).To(refusedLogin(), "the tenant's own password logs in")
	})

	It("in a namespace the server does not admit, gets no credentials and no user, and says why", func() {
		createClient(outside, outsideNS, "dbdump", server, "")
		Eventually(events(outsideNS, "dbdump")).WithTimeout(provisionTimeout).Should(ContainElement(
			HavePrefix("Warning NamespaceNotAdmitted: BackupStorageLocationServer " + storageNS + "/main does not admit namespace " + outsideNS)))
		c := &v1alpha1.BackupClient{}
		Expect(outside.Client.Get(ctx, types.NamespacedName{Namespace: outsideNS, Name: "dbdump"}, c)).To(Succeed())
		ready := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionReady)
		Expect(ready).NotTo(BeNil())
		Expect(ready.Status).To(Equal(metav1.ConditionFalse))
		Expect(ready.Reason).To(Equal(v1alpha1.BackupClientReasonNamespaceNotAdmitted))
		Consistently(func() error {
			return outside.Client.Get(ctx, types.NamespacedName{Namespace: outsideNS, Name: "dbdump-backupclient"}, &corev1.Secret{})
		}).WithTimeout(3*time.Second).Should(MatchError(ContainSubstring("not found")), "credentials were issued")
		Expect(usersOf(s.BSLS, c.Status.Identity)).NotTo(ContainSubstring(c.Status.Identity+" "), "the users Secrets list %s", c.Status.Identity)
	})
})

// allowBackupClients lets tenant t manage BackupClients in its namespace,
// as the chart's aggregated edit role does.
func allowBackupClients(t *Tenant) {
	GinkgoHelper()
	name := "backupclients-" + t.Name
	Expect(platform.API.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.Namespace},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"backupclients"},
			Verbs: []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}}},
	})).To(Succeed())
	Expect(platform.API.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: t.Name}},
	})).To(Succeed())
}

// createClient creates, as t, BackupClient namespace/name of server,
// writing its credentials into secretName ("" for the default).
func createClient(t *Tenant, namespace, name string, server v1alpha1.ServerReference, secretName string) {
	GinkgoHelper()
	Expect(t.Client.Create(ctx, &v1alpha1.BackupClient{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       v1alpha1.BackupClientSpec{Server: server, SecretName: secretName},
	})).To(Succeed())
}

// waitClientReady waits until BackupClient namespace/name is Ready, and
// returns it.
func waitClientReady(namespace, name string) *v1alpha1.BackupClient {
	GinkgoHelper()
	c := &v1alpha1.BackupClient{}
	Eventually(func() []metav1.Condition {
		Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, c)).To(Succeed())
		return c.Status.Conditions
	}).WithTimeout(provisionTimeout).Should(ContainElement(And(
		HaveField("Type", v1alpha1.ConditionReady), HaveField("Status", metav1.ConditionTrue))), "BackupClient %s/%s Ready", namespace, name)
	return c
}

// clientSecret reads, as tenant t (ordinary RBAC in its namespace), the
// Secret a workload of the namespace mounts.
func clientSecret(t *Tenant, namespace, name string) *corev1.Secret {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(t.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, s)).To(Succeed())
	return s
}

// connectWithSecret connects a fresh kopia client with what secret holds
// and nothing else, as a pod that mounts it: its connect line, its password
// in KOPIA_PASSWORD and its CA as the only trust. The server's users may
// lag the Secret by a user sync, so it tries until the login is accepted.
//
// A host's Secret holds no password: its admin gives theirs.
func connectWithSecret(secret *corev1.Secret, adminsPassword ...string) *testbed.KopiaClient {
	GinkgoHelper()
	kopia := testbed.NewKopiaClient(GinkgoT())
	password := string(secret.Data[clientsecret.KeyPassword])
	if len(adminsPassword) > 0 {
		password = adminsPassword[0]
	}
	Eventually(func() error {
		out, err := kopia.ConnectLine(ctx, string(secret.Data[clientsecret.KeyConnect]), secret.Data[clientsecret.KeyCA], password)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}).WithTimeout(provisionTimeout).WithPolling(time.Second).Should(Succeed(),
		"the client connects with Secret %s/%s", secret.Namespace, secret.Name)
	return kopia
}
