package operations

import (
	"context"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// The per-VM quota, with the product as it runs: nothing bounded what one
// VM stores, so one careless or compromised guest could fill the storage
// for every other. Now the admin sets spec.quota; each server pod measures
// what each VM stores and its session gate refuses the writes of a VM that
// reached its quota, with the reason in the guest's kopia, an Event on the
// VM and status.quota on the BSLS. The VM's snapshots still list, restore
// and delete, and its guest backs up again, with no action in it, once it
// stores less or its quota is raised.
var _ = Describe("A VM that reaches its backup quota", Ordered, func() {
	const quota = 3 << 20 // a few MiB of random files reach it
	var (
		c      *cluster
		bsls   *v1alpha1.BackupStorageLocationServer
		guest  *testbed.KopiaClient
		source string
		more   string // what took the VM over its quota
		first  string // the first snapshot's ID
	)
	snapshot := func(path string) (string, error) {
		run, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		return guest.Run(run, "snapshot", "create", path)
	}
	// snapshots is a snapshot of path that must succeed, for Eventually.
	snapshots := func(path string) func() error {
		return func() error {
			out, err := snapshot(path)
			if err != nil {
				return &kopiaError{err: err, out: out}
			}
			return nil
		}
	}
	status := func() (*v1alpha1.QuotaStatus, error) {
		b := &v1alpha1.BackupStorageLocationServer{}
		if err := c.API.Client.Get(ctx, client.ObjectKeyFromObject(bsls), b); err != nil {
			return nil, err
		}
		return b.Status.Quota, nil
	}
	vmEvents := func() ([]string, error) {
		return c.Events(ctx, vmNamespace, "VirtualMachine", vmName)
	}
	setQuota := func(q *v1alpha1.QuotaSpec) {
		GinkgoHelper()
		b := &v1alpha1.BackupStorageLocationServer{}
		Expect(c.API.Client.Get(ctx, client.ObjectKeyFromObject(bsls), b)).To(Succeed())
		patch := client.MergeFrom(b.DeepCopy())
		b.Spec.Quota = q
		Expect(c.API.Client.Patch(ctx, b, patch)).To(Succeed())
	}
	spec := func(overrides ...v1alpha1.QuotaOverride) *v1alpha1.QuotaSpec {
		return &v1alpha1.QuotaSpec{
			PerVM:           resource.NewQuantity(quota, resource.BinarySI),
			Overrides:       overrides,
			MeasureInterval: &metav1.Duration{Duration: 10 * time.Second},
		}
	}

	BeforeAll(func() {
		var b *v1alpha1.BackupStorageLocationServer
		var port int
		c, b, port = startBSLS()
		b.Spec.Quota = spec()
		_, bsls = c.serve(b, port)

		guest = c.optIn()
		source = randomFiles(1, 1<<20)
		out, err := snapshot(source)
		Expect(err).NotTo(HaveOccurred(), out)
		ids, err := guest.SnapshotIDs(ctx, source)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))
		first = ids[0]
	})

	It("lets a VM under its quota back up, and lists no VM over it", func() {
		Eventually(status).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			Not(BeNil()), HaveField("MeasuredAt", Not(BeNil())), HaveField("VMsOverQuota", BeZero())))
	})

	It("refuses the guest's writes once the VM reached its quota, saying why in the guest and on the VM", func() {
		By("the guest stores more than its quota: the snapshot that crosses it is taken, the measurement comes after")
		more = randomFiles(3, 1<<20)
		out, err := snapshot(more)
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(status).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveField("VMsOverQuota", BeEquivalentTo(1)),
			HaveField("OverQuota", ConsistOf(And(
				HaveField("VM", vmNamespace+"/"+vmName),
				HaveField("UsedBytes", BeNumerically(">=", quota)),
				HaveField("QuotaBytes", BeEquivalentTo(quota)))))))
		Eventually(vmEvents).WithTimeout(toldWithin).WithPolling(time.Second).Should(ContainElement(And(
			HavePrefix("Warning "+kopiaserver.ReasonBackupQuotaExceeded+": "),
			ContainSubstring("reaching its quota of 3.0 MiB"))))

		By("its next snapshot fails in the guest, with the gate's reason")
		Expect(os.WriteFile(filepath.Join(source, "new"), []byte("written over quota\n"), 0o600)).To(Succeed())
		refused := func() string {
			out, err := snapshot(source)
			if err == nil {
				return "the snapshot succeeded: " + out
			}
			return out
		}
		Eventually(refused).WithTimeout(toldWithin).WithPolling(time.Second).
			Should(ContainSubstring("guestbackup: VirtualMachine "+vmNamespace+"/"+vmName+" stores"), "the gate refuses the write, saying why")
		Expect(refused()).To(ContainSubstring("reaching its backup quota of 3.0 MiB"))
		ids, err := guest.SnapshotIDs(ctx, source)
		Expect(err).NotTo(HaveOccurred(), "the VM's snapshots still list")
		Expect(ids).To(Equal([]string{first}), "no snapshot was written over quota")

		By("what it has still restores")
		target := GinkgoT().TempDir()
		out, err = guest.Run(ctx, "snapshot", "restore", first, filepath.Join(target, "restored"))
		Expect(err).NotTo(HaveOccurred(), out)
		want, err := os.ReadFile(filepath.Join(source, "file0"))
		Expect(err).NotTo(HaveOccurred())
		Expect(os.ReadFile(filepath.Join(target, "restored", "file0"))).To(Equal(want), "restored byte for byte")
	})

	It("lets the guest back up again, with no action in it, once the admin raises the VM's quota", func() {
		setQuota(spec(v1alpha1.QuotaOverride{Namespace: vmNamespace, Name: vmName, PerVM: resource.NewQuantity(1<<30, resource.BinarySI)}))
		Eventually(snapshots(source)).WithTimeout(toldWithin).WithPolling(time.Second).
			Should(Succeed(), "the raised quota takes effect on the last measurement")
		Eventually(status).WithTimeout(toldWithin).WithPolling(time.Second).Should(HaveField("VMsOverQuota", BeZero()))
		Eventually(vmEvents).WithTimeout(toldWithin).WithPolling(time.Second).Should(ContainElement(And(
			HavePrefix("Normal "+kopiaserver.ReasonBackupQuotaRestored+": "),
			ContainSubstring("it no longer reaches its quota"))))
	})

	It("lets the owner delete snapshots while over quota, and the guest backs up again once it stores less", func() {
		By("the override goes: the VM is over the default quota again")
		setQuota(spec())
		Eventually(status).WithTimeout(toldWithin).WithPolling(time.Second).Should(HaveField("VMsOverQuota", BeEquivalentTo(1)))

		By("the owner deletes every snapshot in the guest: deletions pass the gate")
		for _, path := range []string{source, more} {
			ids, err := guest.SnapshotIDs(ctx, path)
			Expect(err).NotTo(HaveOccurred())
			for _, id := range ids {
				out, err := guest.Run(ctx, "snapshot", "delete", id, "--delete")
				Expect(err).NotTo(HaveOccurred(), out)
			}
		}

		By("the next measurement finds it under its quota: its guest backs up again")
		Eventually(status).WithTimeout(toldWithin).WithPolling(time.Second).Should(HaveField("VMsOverQuota", BeZero()))
		Eventually(snapshots(source)).WithTimeout(toldWithin).WithPolling(time.Second).Should(Succeed())
		Eventually(func() (int, error) {
			return countOf(vmEvents, HavePrefix("Normal "+kopiaserver.ReasonBackupQuotaRestored+": "))
		}).WithTimeout(toldWithin).WithPolling(time.Second).Should(BeNumerically(">=", 2), "restored twice: raised, then emptied")
	})
})
