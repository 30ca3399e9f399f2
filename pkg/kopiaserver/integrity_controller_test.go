package kopiaserver_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// Verification (docs/design.md, decision 27): storage that lost or damaged a pack is named in the BSLS's
// RepositoryIntact condition, its status and an Event on each VM that owns
// a damaged snapshot, and its healing too. The server pod's verification
// is played here by writing what it publishes into the state ConfigMap.
var _ = Describe("RepositoryIntact, from the server pod's verification", Ordered, func() {
	const (
		ns     = "verified"
		vmNS   = "team-v"
		name   = "main"
		vmName = "web"
		path   = "/var/www"
	)
	var (
		ctx context.Context
		api *testbed.APIServer
		vm  *kubevirtv1.VirtualMachine
	)
	bsls := func() *v1alpha1.BackupStorageLocationServer {
		b, err := getBSLS(ctx, api, ns, name)
		if err != nil {
			return nil
		}
		return b
	}
	haveCondition := func(status metav1.ConditionStatus, reason string, message ...string) OmegaMatcher {
		m := []OmegaMatcher{Not(BeNil()), HaveField("Status", status), HaveField("Reason", reason)}
		for _, s := range message {
			m = append(m, HaveField("Message", ContainSubstring(s)))
		}
		return And(m...)
	}
	// intact and ready are, for Eventually, the BSLS's RepositoryIntact
	// and Ready conditions.
	var intact, ready func() *metav1.Condition
	// vmEvents are the Events on the VM, with its UID, each as
	// "<type> <reason>: <message>" with its count.
	vmEvents := func() map[string]int32 {
		list := &corev1.EventList{}
		if err := api.Client.List(ctx, list, client.InNamespace(vmNS)); err != nil {
			return nil
		}
		out := map[string]int32{}
		for _, e := range list.Items {
			o := e.InvolvedObject
			if o.Kind == "VirtualMachine" && o.Name == vmName && o.UID == vm.UID {
				out[e.Type+" "+e.Reason+": "+e.Message] += e.Count
			}
		}
		return out
	}
	// publish writes s as the server pod publishes it.
	publish := func(s maintenancestate.IntegrityState) {
		GinkgoHelper()
		Eventually(func() error {
			cm := &corev1.ConfigMap{}
			if err := api.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: maintenancestate.ConfigMapName(name)}, cm); err != nil {
				return err
			}
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			cm.Data[maintenancestate.IntegrityKey] = maintenancestate.EncodeIntegrity(s)
			return api.Client.Update(ctx, cm)
		}).WithTimeout(reconciled).Should(Succeed())
	}

	BeforeAll(func() {
		ctx = context.Background()
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
		for _, n := range []string{ns, vmNS} {
			Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})).To(Succeed())
		}
		intact = bslsCondition(ctx, api, ns, name, v1alpha1.ConditionRepositoryIntact)
		ready = bslsCondition(ctx, api, ns, name, v1alpha1.ConditionReady)
		vm = &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: vmName, Namespace: vmNS},
			Spec: kubevirtv1.VirtualMachineSpec{
				RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
				Template:    &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{}}}},
			},
		}
		Expect(api.Client.Create(ctx, vm)).To(Succeed())
		startController(api)
		Expect(api.Client.Create(ctx, &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
		})).To(Succeed())
	})

	It("is Unknown before any verification is published, and Ready does not wait for it", func() {
		Eventually(intact).WithTimeout(reconciled).Should(haveCondition(metav1.ConditionUnknown, kopiaserver.ReasonNotVerified, "No verification of the repository is published yet"))
		Expect(ready()).To(And(Not(BeNil()), HaveField("Message", Not(ContainSubstring(v1alpha1.ConditionRepositoryIntact)))))
		Expect(bsls().Status.Integrity).To(BeNil())
	})

	verified := time.Now().Add(-time.Minute).Truncate(time.Second).UTC()
	oldest, newest := verified.Add(-72*time.Hour), verified.Add(-time.Hour)

	It("is False when snapshots reference lost data, fills status.integrity and warns the VM that owns them, once", func() {
		publish(maintenancestate.IntegrityState{
			CheckedAt: verified, VerifiedAt: verified,
			Contents: 900, Packs: 40, ReadPacks: 4, ReadBytes: 80 << 20,
			MissingPacks: []string{"p0123abc"}, LostContents: 12, Pending: 2,
			DamagedSnapshots: 3, DamagedSince: verified,
			Damaged: []maintenancestate.DamagedSource{{
				User: vmName, Host: vmNS, Path: path, Snapshots: 3, Files: 7,
				Oldest: oldest, Newest: newest, IDs: []string{"k3", "k2", "k1"}, Healing: true,
			}},
		})
		Eventually(intact).WithTimeout(reconciled).Should(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonContentsLost,
			"pack p0123abc missing from the storage", "12 contents lost and dropped from the index",
			"3 snapshots of 1 VMs reference it", "team-v/web:/var/www (3)", "2 lost contents stay in the index, marked deleted", "docs/operations.md"))
		Expect(ready()).To(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonNotReady, v1alpha1.ConditionRepositoryIntact))
		Eventually(bslsEvents(ctx, api, ns, name)).Should(ContainElement(HavePrefix("Warning " + kopiaserver.ReasonContentsLost + ": " + v1alpha1.ConditionRepositoryIntact + ": ")))

		st := bsls().Status.Integrity
		Expect(st).NotTo(BeNil())
		Expect(st.LastVerified.Time).To(BeTemporally("==", verified))
		Expect(st).To(And(HaveField("Contents", int64(900)), HaveField("Packs", int64(40)), HaveField("ReadBytes", int64(80<<20)),
			HaveField("MissingPacks", []string{"p0123abc"}), HaveField("LostContents", int64(12)), HaveField("PendingContents", int64(2)), HaveField("DamagedSnapshots", int64(3))))
		Expect(st.Damaged).To(ConsistOf(And(HaveField("Namespace", vmNS), HaveField("Name", vmName), HaveField("Path", path),
			HaveField("Snapshots", int64(3)), HaveField("Files", int64(7)), HaveField("IDs", []string{"k3", "k2", "k1"}), HaveField("Healing", true))))

		damaged := "Warning " + kopiaserver.ReasonBackupDamaged + ": 3 snapshots of /var/www on BackupStorageLocationServer verified/main reference data the storage lost (started " +
			oldest.Format(time.RFC3339) + " to " + newest.Format(time.RFC3339) + "; IDs k3, k2, k1): 7 files in them miss data."
		Eventually(vmEvents).WithTimeout(reconciled).Should(HaveKey(HavePrefix(damaged)))

		By("not warning again at a later pass that finds the same")
		// As the pod publishes a pass that found nothing new: the damage,
		// and the packs that explain it.
		later := verified.Add(30 * time.Second)
		publish(maintenancestate.IntegrityState{
			CheckedAt: later, VerifiedAt: later, Contents: 900, Packs: 40, ReadPacks: 4, ReadBytes: 80 << 20,
			MissingPacks: []string{"p0123abc"}, DamagedSnapshots: 3, DamagedSince: verified,
			Damaged: []maintenancestate.DamagedSource{{User: vmName, Host: vmNS, Path: path, Snapshots: 3, Files: 7, Oldest: oldest, Newest: newest, IDs: []string{"k3", "k2", "k1"}, Healing: true}},
		})
		Eventually(func() *metav1.Time { return bsls().Status.Integrity.LastVerified }).WithTimeout(reconciled).Should(HaveField("Time", BeTemporally("==", later)))
		Consistently(vmEvents).WithTimeout(3 * time.Second).Should(And(
			HaveLen(1), WithTransform(func(m map[string]int32) []int32 {
				var counts []int32
				for _, c := range m {
					counts = append(counts, c)
				}
				return counts
			}, ConsistOf(int32(1)))))
	})

	It("is True again once no snapshot references lost data, and tells the VM its snapshots healed", func() {
		healed := verified.Add(time.Minute)
		publish(maintenancestate.IntegrityState{CheckedAt: healed, VerifiedAt: healed, Contents: 912, Packs: 41, ReadPacks: 4, ReadBytes: 81 << 20})
		Eventually(intact).WithTimeout(reconciled).Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonIntact,
			"Verified at "+healed.Format(time.RFC3339)+": all 912 contents the index names are in the 41 packs the storage holds, and 4 packs (84934656 bytes) read back and decrypted"))
		Expect(ready()).To(And(Not(BeNil()), HaveField("Message", Not(ContainSubstring(v1alpha1.ConditionRepositoryIntact)))))
		Eventually(vmEvents).WithTimeout(reconciled).Should(HaveKey(
			"Normal " + kopiaserver.ReasonBackupHealed + ": No snapshot of /var/www on BackupStorageLocationServer verified/main references lost data any more (verified at " +
				healed.Format(time.RFC3339) + "): the guest uploaded the lost files again, or the damaged snapshots expired"))
		st := bsls().Status.Integrity
		Expect(st.Damaged).To(BeEmpty())
		Expect(st.DamagedSnapshots).To(BeZero())
		Eventually(bslsEvents(ctx, api, ns, name)).Should(ContainElement(HavePrefix("Normal " + kopiaserver.ReasonIntact + ": " + v1alpha1.ConditionRepositoryIntact + ": ")))
	})

	It("tells the VM when damaged snapshots that could not heal were rewritten, and does not call them healed", func() {
		damagedAt, settledAt := verified.Add(2*time.Minute), verified.Add(3*time.Minute)
		srv := maintenancestate.DamagedSource{User: vmName, Host: vmNS, Path: "/srv", Snapshots: 2, Files: 3, Oldest: oldest, Newest: newest, IDs: []string{"s2", "s1"}}
		publish(maintenancestate.IntegrityState{
			CheckedAt: damagedAt, VerifiedAt: damagedAt, Contents: 912, Packs: 41, MissingPacks: []string{"p0456def"}, LostContents: 5,
			DamagedSnapshots: 2, DamagedSince: damagedAt, Damaged: []maintenancestate.DamagedSource{srv},
		})
		Eventually(vmEvents).WithTimeout(reconciled).Should(HaveKey(HavePrefix("Warning " + kopiaserver.ReasonBackupDamaged + ": 2 snapshots of /srv")))

		By("settling them: the guest's latest snapshot is whole, so they could not heal")
		publish(maintenancestate.IntegrityState{CheckedAt: settledAt, VerifiedAt: settledAt, Contents: 912, Packs: 41, Settled: []maintenancestate.DamagedSource{srv}})
		Eventually(intact).WithTimeout(reconciled).Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonIntact,
			"settled 2 damaged snapshots of 1 VMs that could no longer heal: their 3 lost files are replaced by stubs"))
		settled := "Warning " + kopiaserver.ReasonBackupSettled + ": 2 damaged snapshots of /srv on BackupStorageLocationServer verified/main could no longer heal"
		Eventually(vmEvents).WithTimeout(reconciled).Should(HaveKey(HavePrefix(settled)))
		Expect(bsls().Status.Integrity.Settled).To(ConsistOf(And(HaveField("Path", "/srv"), HaveField("Files", int64(3)))))
		Consistently(vmEvents).WithTimeout(3 * time.Second).Should(And(
			Not(HaveKey(HavePrefix("Normal "+kopiaserver.ReasonBackupHealed+": No snapshot of /srv"))),
			HaveKeyWithValue(HavePrefix(settled), int32(1))))
	})

	It("reports what it cannot read in the status and the condition, and keeps what it knew", func() {
		Eventually(func() error {
			cm := &corev1.ConfigMap{}
			if err := api.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: maintenancestate.ConfigMapName(name)}, cm); err != nil {
				return err
			}
			cm.Data[maintenancestate.IntegrityKey] = "{not json"
			return api.Client.Update(ctx, cm)
		}).WithTimeout(reconciled).Should(Succeed())
		Eventually(intact).WithTimeout(reconciled).Should(haveCondition(metav1.ConditionUnknown, kopiaserver.ReasonVerificationFailed, "cannot be read", "key integrity"))
		st := bsls().Status.Integrity
		Expect(st.Failure).To(ContainSubstring("key integrity"))
		Expect(st.Contents).To(Equal(int64(912)), "what the last readable report said")
	})
})
