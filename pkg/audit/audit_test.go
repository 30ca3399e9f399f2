package audit_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	gtypes "github.com/onsi/gomega/types"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/serverpod/activityscan"
)

const (
	vmNamespace   = "team-a"
	bslsNamespace = "backup"
	bslsName      = "main"
	// staleAfter is the test's window for a schedule without a period.
	staleAfter = 5 * time.Second
)

var _ = Describe("The guest activity audit", Ordered, func() {
	var (
		ctx         context.Context
		api         *testbed.APIServer
		srv         *testbed.KopiaServer
		guest       *testbed.KopiaClient
		scanner     *activityscan.Scanner
		r           repo.Repository
		configMaps  = func() kubernetes.Interface { return kubernetes.NewForConfigOrDie(api.Config) }
		metricsAddr string
		data        string
		issuedAt    time.Time
	)
	// publish does what the server pod's user-sync container does every
	// activity interval.
	publish := func() {
		GinkgoHelper()
		Expect(r.Refresh(ctx)).To(Succeed())
		_, err := scanner.Scan(ctx, r)
		Expect(err).NotTo(HaveOccurred())
		Expect(scanner.Publish(ctx, configMaps().CoreV1().ConfigMaps(bslsNamespace), bslsName, nil)).To(Succeed())
		Expect(scanner.PublishCatalogues(ctx, configMaps().CoreV1().ConfigMaps(bslsNamespace), bslsName)).To(Succeed())
	}
	events := func(reason string) func() []string { return vmEvents(ctx, api, "web", reason) }
	protection := func() (*v1alpha1.GuestProtection, error) {
		p := &v1alpha1.GuestProtection{}
		return p, api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: "web"}, p)
	}
	condition := func(typ string, status metav1.ConditionStatus, reason string) gtypes.GomegaMatcher {
		return HaveField("Status.Conditions", ContainElement(And(HaveField("Type", typ), HaveField("Status", status), HaveField("Reason", reason))))
	}
	metric := func(name string) func() (float64, error) {
		return func() (float64, error) {
			return testbed.Metric(metricsAddr, name, map[string]string{"namespace": vmNamespace, "vm": "web", "bsls": bslsNamespace + "/" + bslsName})
		}
	}

	BeforeAll(func() {
		ctx = context.Background()
		api = startAuditBed(ctx)
		password := testbed.RandomPassword()
		issuedAt = time.Now().UTC()
		createOptedInVM(ctx, api, "web", map[string]string{
			v1alpha1.AnnotationPaths:    "/srv/data",
			v1alpha1.AnnotationSchedule: "Mon *-*-* 02:00:00", // no fixed period: the test's window applies
		}, kubevirtv1.RunStrategyHalted, issuedAt, password)

		srv = testbed.StartKopiaServer(GinkgoT(), testbed.KopiaServerOptions{})
		srv.AddUser(GinkgoT(), "web@team-a", password)
		var err error
		r, err = repo.Open(ctx, srv.ConfigFile, srv.RepoPassword, &repo.Options{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(r.Close(context.Background())).To(Succeed()) })
		scanner = activityscan.New()
		guest = testbed.NewKopiaClient(GinkgoT())
		out, err := guest.Connect(ctx, srv.URL, srv.CA.CertPEM(), "web@team-a", password)
		Expect(err).NotTo(HaveOccurred(), out)
		data = GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(data, "ledger.csv"), []byte(strings.Repeat("a,b,c\n", 1000)), 0o600)).To(Succeed())

		port, err := testbed.FreePort()
		Expect(err).NotTo(HaveOccurred())
		metricsAddr = "127.0.0.1:" + strconv.Itoa(port)
		stop, err := testbed.RunManager(api, testbed.ManagerOptions{Logger: GinkgoLogr, MetricsAddr: metricsAddr, Cache: controller.Cache()}, func(mgr ctrl.Manager) error {
			return (&audit.Reconciler{StaleAfter: staleAfter}).SetupWithManager(mgr)
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(stop()).To(Succeed()) })
	})

	It("warns that a VM has not backed up within the window", func() {
		publish()
		Eventually(events(audit.ReasonBackupStale)).WithTimeout(staleAfter + 10*time.Second).Should(ConsistOf(
			And(HavePrefix("Warning No snapshot of /srv/data within 5s since its credentials were issued"), ContainSubstring("journalctl -u guestbackup-snapshot"))))

		By("not before the window has passed")
		// Compared with the Event's own timestamp rather than watched for a
		// while, so a slow machine cannot turn setup time into a failure.
		// Event timestamps have whole-second precision.
		list := &corev1.EventList{}
		Expect(api.Client.List(ctx, list, client.InNamespace(vmNamespace))).To(Succeed())
		for _, e := range list.Items {
			if e.Reason == audit.ReasonBackupStale {
				Expect(e.FirstTimestamp.Time).NotTo(BeTemporally("<", issuedAt.Add(staleAfter).Truncate(time.Second)))
			}
		}

		By("saying so on the VM's GuestProtection, in the VM's namespace and owned by the VM")
		Eventually(protection).Should(And(
			HaveField("Status.Snapshots", BeEquivalentTo(0)),
			HaveField("Status.Server", bslsNamespace+"/"+bslsName),
			HaveField("Status.Identity", "web@team-a"),
			condition(v1alpha1.ConditionBackupFresh, metav1.ConditionFalse, audit.ReasonBackupStale),
			condition(v1alpha1.ConditionGuestConnected, metav1.ConditionUnknown, audit.ReasonNoSnapshotYet)))
		p, err := protection()
		Expect(err).NotTo(HaveOccurred())
		vm := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: "web"}, vm)).To(Succeed())
		Expect(metav1.IsControlledBy(p, vm)).To(BeTrue(), "owned by the VM, so that it goes with it")
	})

	It("records exactly one SnapshotCreated, with path and size, for a snapshot the guest took", func() {
		// Whole seconds: the snapshot's end time is bounded by the test's own
		// clock readings, not by a guess at how slow the machine is.
		before := time.Now().Truncate(time.Second)
		out, err := guest.Run(ctx, "snapshot", "create", data)
		after := time.Now()
		Expect(err).NotTo(HaveOccurred(), out)
		publish()
		Eventually(events(audit.ReasonSnapshotCreated)).WithTimeout(10 * time.Second).Should(ConsistOf(
			And(ContainSubstring("of "+data+": 6000 bytes in 1 files"), ContainSubstring("snapshots kept: 1"))))
		Expect(events(audit.ReasonGuestConnected)()).To(ConsistOf(HavePrefix("Normal Guest backs up as web@team-a: first snapshot at")))
		Eventually(events(audit.ReasonBackupResumed)).Should(HaveLen(1))

		By("saying nothing more when nothing is new")
		publish()
		Consistently(events(audit.ReasonSnapshotCreated)).WithTimeout(3 * time.Second).Should(HaveLen(1))

		By("showing the snapshot on the VM's GuestProtection")
		Eventually(protection).WithTimeout(10 * time.Second).Should(And(
			HaveField("Status.Snapshots", BeEquivalentTo(1)),
			HaveField("Status.LastSnapshot.Path", data),
			HaveField("Status.LastSnapshot.Bytes", BeEquivalentTo(6000)),
			HaveField("Status.LastSnapshot.Files", BeEquivalentTo(1)),
			HaveField("Status.LastSnapshot.EndTime.Time", BeTemporally(">=", before)),
			condition(v1alpha1.ConditionBackupFresh, metav1.ConditionTrue, audit.ReasonWithinSchedule),
			condition(v1alpha1.ConditionGuestConnected, metav1.ConditionTrue, audit.ReasonSnapshotsSeen)))

		By("exporting the last snapshot on the metrics endpoint")
		Expect(metric("guestbackup_vm_last_snapshot_bytes")()).To(Equal(6000.0))
		Expect(metric("guestbackup_vm_snapshots")()).To(Equal(1.0))
		Expect(metric("guestbackup_vm_last_snapshot_timestamp_seconds")()).To(And(
			BeNumerically(">=", float64(before.Unix())), BeNumerically("<=", float64(after.Unix()+1))))
	})

	It("warns again when backups stop, and says when they resume", func() {
		Eventually(events(audit.ReasonBackupStale)).WithTimeout(staleAfter + 10*time.Second).Should(HaveLen(2))
		out, err := guest.Run(ctx, "snapshot", "create", data)
		Expect(err).NotTo(HaveOccurred(), out)
		publish()
		Eventually(events(audit.ReasonBackupResumed)).WithTimeout(10 * time.Second).Should(HaveLen(2))
		Expect(events(audit.ReasonSnapshotCreated)()).To(HaveLen(2))
		Eventually(protection).WithTimeout(10 * time.Second).Should(And(
			HaveField("Status.Snapshots", BeEquivalentTo(2)),
			condition(v1alpha1.ConditionBackupFresh, metav1.ConditionTrue, audit.ReasonWithinSchedule)))

		By("listing both snapshots, newest first, on the VM's GuestProtection")
		ids, err := guest.SnapshotIDs(ctx, data)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(2))
		Eventually(protection).WithTimeout(10 * time.Second).Should(HaveField("Status.RecentSnapshots", HaveExactElements(
			And(HaveField("ID", ids[1]), HaveField("Path", data), HaveField("Bytes", BeEquivalentTo(6000)), HaveField("Files", BeEquivalentTo(1))),
			And(HaveField("ID", ids[0]), HaveField("Path", data)),
		)))
	})

	It("makes the VM's GuestProtection again when it is deleted, and deletes it when the VM opts out", func() {
		deleted, err := protection()
		Expect(err).NotTo(HaveOccurred())
		Expect(api.Client.Delete(ctx, deleted)).To(Succeed())
		Eventually(func() (types.UID, error) {
			p, err := protection()
			return p.UID, err
		}).WithTimeout(10 * time.Second).Should(And(Not(BeEmpty()), Not(Equal(deleted.UID))))
		Eventually(protection).WithTimeout(10 * time.Second).Should(HaveField("Status.Snapshots", BeEquivalentTo(2)))

		By("the owner removing the VM's guestbackup.io/server annotation")
		vm := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: "web"}, vm)).To(Succeed())
		patch := client.MergeFrom(vm.DeepCopy())
		delete(vm.Annotations, v1alpha1.AnnotationServer)
		Expect(api.Client.Patch(ctx, vm, patch)).To(Succeed())
		Eventually(func() bool {
			_, err := protection()
			return apierrors.IsNotFound(err)
		}).WithTimeout(10 * time.Second).Should(BeTrue())
	})
})

// A role wider than the chart's (a wildcard on guestbackup.io) could let a
// tenant write GuestProtections: what they write must not stand. The
// controller here rechecks nothing on a timer within the spec (its stale
// window is an hour, the VM runs no instance), so only its watch of the
// GuestProtections can undo a write.
var _ = Describe("A GuestProtection a tenant writes", Ordered, func() {
	var (
		ctx    context.Context
		api    *testbed.APIServer
		tenant client.Client
	)
	protection := func() (*v1alpha1.GuestProtection, error) {
		p := &v1alpha1.GuestProtection{}
		return p, api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: "quiet"}, p)
	}

	BeforeAll(func() {
		ctx = context.Background()
		api = startAuditBed(ctx)
		createOptedInVM(ctx, api, "quiet", map[string]string{v1alpha1.AnnotationPaths: "/srv"}, kubevirtv1.RunStrategyHalted, time.Now().UTC(), testbed.RandomPassword())
		stop, err := testbed.RunManager(api, testbed.ManagerOptions{Logger: GinkgoLogr, Cache: controller.Cache()}, func(mgr ctrl.Manager) error {
			return (&audit.Reconciler{StaleAfter: time.Hour}).SetupWithManager(mgr)
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(stop()).To(Succeed()) })

		tenant, err = api.Tenant(ctx, vmNamespace, "tenant", rbacv1.PolicyRule{
			APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"guestprotections", "guestprotections/status"},
			Verbs: []string{"get", "list", "create", "update", "patch", "delete"},
		})
		Expect(err).NotTo(HaveOccurred())
		Eventually(protection).Should(HaveField("Status.Identity", "quiet@"+vmNamespace))
	})

	It("writes the truth back over a status the tenant wrote", func() {
		p, err := protection()
		Expect(err).NotTo(HaveOccurred())
		patch := client.MergeFrom(p.DeepCopy())
		p.Status.Snapshots = 99
		p.Status.Conditions = nil
		Expect(tenant.Status().Patch(ctx, p, patch)).To(Succeed())
		Eventually(protection).WithTimeout(10*time.Second).Should(And(
			HaveField("Status.Snapshots", BeEquivalentTo(0)),
			HaveField("Status.Conditions", HaveLen(2))), "the controller writes the truth back")
	})

	It("replaces a GuestProtection the VM does not own with its own", func() {
		p, err := protection()
		Expect(err).NotTo(HaveOccurred())
		Expect(tenant.Delete(ctx, p)).To(Succeed())
		Expect(tenant.Create(ctx, &v1alpha1.GuestProtection{ObjectMeta: metav1.ObjectMeta{Name: "quiet", Namespace: vmNamespace}})).
			To(Or(Succeed(), MatchError(ContainSubstring("already exists"))))
		Eventually(protection).WithTimeout(10 * time.Second).Should(And(
			HaveField("OwnerReferences", ContainElement(HaveField("Kind", "VirtualMachine"))),
			HaveField("Status.Identity", "quiet@"+vmNamespace)))
	})
})
