package security

import (
	"net/url"
	"strconv"
	"time"

	"github.com/kopia/kopia/repo"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// fullVolumeSize is the repository claim of the spec: small enough to fill
// at once, big enough for the repository and its users.
const fullVolumeSize = 64 << 20

// A guest fills the storage, and then a VM whose password had leaked is
// deleted. User sync cannot write the user's removal into the repository,
// and Kopia's server, which knows only the repository, let the thief log
// in, list and restore for as long as the storage stayed full. Revocation
// never waits for space: the gate refuses whom the users Secrets no longer
// list, and the sessions end.
var _ = Describe("A deleted VM's leaked password, while the storage is full", Ordered, func() {
	const ns = "full-storage"
	var (
		s                  Server
		username, password string
		claim              string
		// held is the thief's session, opened while the VM existed.
		held repo.Repository
	)
	BeforeAll(func() {
		newNamespace(ns, nil)
		b := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: ns},
			Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
		}
		claim = testbed.SmallVolume(GinkgoT(), fullVolumeSize)
		platform.UseClaim(b, claim)
		s = serveBSLS(b)
		createVM(platform.API.Client, ns, "leaky", ns+"/main")
		username, password = waitProvisioned(s, ns, "leaky")
		held = guestOpen(s, username, password)
		Expect(heldReads(held)()).To(Succeed(), "the holder of leaky's password holds a session")

		By("filling the repository's volume, as a guest that snapshots without bound does")
		_, err := testbed.FillVolume(claim, 0)
		Expect(err).NotTo(HaveOccurred())
		// The ballast is removed with the volume.
	})

	It("refuses the deleted VM's user and ends its session, though its removal cannot be written", func() {
		vm := &kubevirtv1.VirtualMachine{}
		Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "leaky"}, vm)).To(Succeed())
		Expect(platform.API.Client.Delete(ctx, vm)).To(Succeed())
		Eventually(func() string { return usersOf(s.BSLS, username) }).WithTimeout(guestACLSyncTimeout).ShouldNot(ContainSubstring(username+" "),
			"leaky's user leaves the users Secrets with its VM")
		Eventually(s.Pod.Containers["user-sync"].Log).WithTimeout(guestACLSyncTimeout).Should(ContainSubstring("no space left on device"),
			"user sync tried to write the removal into the full repository, and could not")

		Eventually(func() *metav1.Condition {
			b := &v1alpha1.BackupStorageLocationServer{}
			Expect(platform.API.Client.Get(ctx, client.ObjectKeyFromObject(s.BSLS), b)).To(Succeed())
			return meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionUsersSynced)
		}).WithTimeout(guestACLSyncTimeout).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "UsersNotApplied"),
			HaveField("Message", ContainSubstring("no space left on device"))),
			"the admin is told that the users Secrets are not applied, and why")

		Eventually(heldReads(held)).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(HaveOccurred(),
			"the session leaky's password opened still reads the repository")
		Eventually(guestBSLSEvents(s.BSLS)).WithTimeout(guestACLSyncTimeout).Should(ContainElement(And(
			HavePrefix("Normal SessionsEnded: "), ContainSubstring(username+": 1 (user removed)"))))
		_, err := loginAs(s, username, password)
		Expect(err).To(refusedLogin(), "the leaked password opens no new session")
	})

	It("keeps the pod in its Service, so that the other guests can still read what they have", func() {
		Consistently(func() error { return s.Pod.WaitReady(5*time.Second, "user-sync") }).
			WithTimeout(15*time.Second).WithPolling(time.Second).Should(Succeed(),
			"the user-sync container's /readyz, though user sync cannot write")
		Expect(s.Pod.Containers["user-sync"].Log()).To(ContainSubstring("no space left on device"), "user sync still fails to write")
	})

	It("serves again, the deleted VM's user refused, after its server pod restarts on the full storage", func() {
		for _, c := range s.Pod.Containers {
			c.Stop()
		}
		u, err := url.Parse(s.URL)
		Expect(err).NotTo(HaveOccurred())
		port, err := strconv.Atoi(u.Port())
		Expect(err).NotTo(HaveOccurred())
		pod, err := platform.ServeBSLS(ctx, GinkgoT(), s.BSLS, port)
		Expect(err).NotTo(HaveOccurred(), "a new server pod on the same full claim becomes ready")
		Expect(pod.Containers["user-sync"].Log()).To(ContainSubstring("no space left on device"), "its user sync could not write the removal either")
		_, err = loginAs(s, username, password)
		Expect(err).To(refusedLogin(), "the leaked password opens no session on the new pod")
	})
})
