package operations

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// smallVolume is the size of the repository's volume in the storage
// space specs: a few guests' snapshots fill it.
const smallVolume = 64 << 20

// Storage space (docs/design.md, decision 29) with the product as it runs:
// a guest fills the small volume of a filesystem BSLS. Before, the BSLS
// stayed Ready=True with no byte free, and nobody was told. Now the server
// pod measures the volume at each storage check and the BSLS says how much
// is free in its StorageSpace condition: a Warning LowSpace below 10%,
// which leaves it Ready, and StorageFull, which does not, at no byte free
// or when the storage refuses a write of the server pod's; both clear once
// there is space again, and the guest snapshots again by itself.
var _ = Describe("A filesystem BSLS whose small volume fills up", Ordered, func() {
	var (
		c       *cluster
		bsls    *v1alpha1.BackupStorageLocationServer
		volume  string
		guest   *testbed.KopiaClient
		source  string
		ballast string
	)

	// conditions are the BSLS's conditions, by type.
	conditions := func() (map[string]metav1.Condition, error) {
		b := &v1alpha1.BackupStorageLocationServer{}
		if err := c.API.Client.Get(ctx, client.ObjectKeyFromObject(bsls), b); err != nil {
			return nil, err
		}
		out := map[string]metav1.Condition{}
		for _, cond := range b.Status.Conditions {
			out[cond.Type] = cond
		}
		return out, nil
	}
	condition := func(status metav1.ConditionStatus, reason string, message ...string) types.GomegaMatcher {
		matchers := []types.GomegaMatcher{HaveField("Status", status), HaveField("Reason", reason)}
		for _, m := range message {
			matchers = append(matchers, HaveField("Message", ContainSubstring(m)))
		}
		return And(matchers...)
	}
	events := func() ([]string, error) {
		return c.Events(ctx, storageNamespace, "BackupStorageLocationServer", bslsName)
	}
	// states are what the server pods published of the storage, for the
	// controller.
	states := func() (map[string]maintenancestate.StorageState, error) {
		cm := &corev1.ConfigMap{}
		if err := c.API.Client.Get(ctx, client.ObjectKey{Namespace: storageNamespace, Name: maintenancestate.ConfigMapName(bslsName)}, cm); err != nil {
			return nil, err
		}
		return maintenancestate.StorageStates(cm.Data), nil
	}
	published := func() string {
		s, err := states()
		data, _ := json.Marshal(s)
		return fmt.Sprintf("the server pods last published %s (%v)", data, err)
	}
	snapshot := func() (string, error) {
		run, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		return guest.Run(run, "snapshot", "create", source)
	}

	BeforeAll(func() {
		var b *v1alpha1.BackupStorageLocationServer
		var port int
		c, b, port = startBSLS()
		volume = testbed.SmallVolume(GinkgoT(), smallVolume)
		c.UseClaim(b, volume)
		_, bsls = c.serve(b, port)

		guest = c.optIn()
		source = randomFiles(2, 1<<20)
		out, err := snapshot()
		Expect(err).NotTo(HaveOccurred(), out)
	})

	It("says how much of the volume is free while there is enough", func() {
		Eventually(conditions).WithTimeout(toldWithin).WithPolling(time.Second).Should(HaveKeyWithValue(v1alpha1.ConditionStorageSpace,
			condition(metav1.ConditionTrue, kopiaserver.ReasonSufficient, "free of 64.0 MiB")), published)
	})

	It("warns below 10% free, with what to do, and stays Ready", func() {
		var err error
		ballast, err = testbed.FillVolume(volume, 5<<20)
		Expect(err).NotTo(HaveOccurred())
		Eventually(conditions).WithTimeout(toldWithin).WithPolling(time.Second).Should(HaveKeyWithValue(v1alpha1.ConditionStorageSpace,
			condition(metav1.ConditionFalse, kopiaserver.ReasonLowSpace, "free of 64.0 MiB", "below 10%", "Grow PersistentVolumeClaim "+storageNamespace+"/"+kopiaserver.ClaimName(bsls))), published)
		Expect(conditions()).To(HaveKeyWithValue(v1alpha1.ConditionReady, condition(metav1.ConditionTrue, kopiaserver.ReasonReady)))
		Eventually(events).Should(ContainElement(HavePrefix("Warning " + kopiaserver.ReasonLowSpace + ": " + v1alpha1.ConditionStorageSpace + ": ")))

		By("the guest still snapshots")
		out, err := snapshot()
		Expect(err).NotTo(HaveOccurred(), out)
	})

	It("is StorageFull at no byte free, the BSLS is not Ready, and a write the server pod tries is refused and said", func() {
		Expect(os.Remove(ballast)).To(Succeed())
		var err error
		ballast, err = testbed.FillVolume(volume, 0)
		Expect(err).NotTo(HaveOccurred())
		Eventually(conditions).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveKeyWithValue(v1alpha1.ConditionStorageSpace, condition(metav1.ConditionFalse, kopiaserver.ReasonStorageFull, "is full, 0 B free of 64.0 MiB")),
			HaveKeyWithValue(v1alpha1.ConditionReady, condition(metav1.ConditionFalse, kopiaserver.ReasonNotReady, v1alpha1.ConditionStorageSpace)),
		), published)
		Eventually(events).Should(ContainElement(HavePrefix("Warning " + kopiaserver.ReasonStorageFull + ": " + v1alpha1.ConditionStorageSpace + ": ")))

		By("a full volume: the guest's snapshot fails")
		Expect(os.WriteFile(source+"/new", []byte("written while the volume is full\n"), 0o600)).To(Succeed())
		out, err := snapshot()
		Expect(err).To(HaveOccurred(), "a snapshot onto a full volume succeeded:\n%s", out)

		By("a VM opted in meanwhile: user sync cannot write its user, and the server pod says the storage refused it")
		Expect(c.API.Client.Create(ctx, testbed.SmallVM(vmNamespace, "db", map[string]string{v1alpha1.AnnotationServer: storageNamespace + "/" + bslsName}))).To(Succeed())
		Eventually(states).WithTimeout(toldWithin).WithPolling(time.Second).Should(ContainElement(
			HaveField("Refused", ContainSubstring("no space left on device"))))
		Eventually(conditions).WithTimeout(toldWithin).WithPolling(time.Second).Should(HaveKeyWithValue(v1alpha1.ConditionStorageSpace,
			condition(metav1.ConditionFalse, kopiaserver.ReasonStorageFull, "refused writes for want of space", "no space left on device")), published)
		Eventually(conditions).WithTimeout(toldWithin).WithPolling(time.Second).Should(HaveKeyWithValue(v1alpha1.ConditionUsersSynced,
			condition(metav1.ConditionFalse, kopiaserver.ReasonUsersNotApplied, "no space left on device", "cannot log in until it does")), published)
	})

	It("is Sufficient and Ready again once there is space, and the guests snapshot again by themselves", func() {
		Expect(os.Remove(ballast)).To(Succeed())
		Eventually(conditions).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveKeyWithValue(v1alpha1.ConditionStorageSpace, condition(metav1.ConditionTrue, kopiaserver.ReasonSufficient)),
			HaveKeyWithValue(v1alpha1.ConditionUsersSynced, condition(metav1.ConditionTrue, kopiaserver.ReasonUsersSynced)),
			HaveKeyWithValue(v1alpha1.ConditionReady, condition(metav1.ConditionTrue, kopiaserver.ReasonReady)),
		), published)
		Expect(states()).To(HaveEach(HaveField("Refused", BeEmpty())), "the refused write was written once there was space")
		Expect(events()).To(ContainElement(HavePrefix("Normal " + kopiaserver.ReasonSufficient + ": " + v1alpha1.ConditionStorageSpace + ": ")))

		out, err := snapshot()
		Expect(err).NotTo(HaveOccurred(), out)
		var db *testbed.KopiaClient
		Eventually(func() error {
			var err error
			db, err = connect(install(c.secretOf("db")))
			return err
		}).WithTimeout(provisionTimeout).WithPolling(2*time.Second).Should(Succeed(), "the VM opted in while the volume was full logs in")
		out, err = db.Run(ctx, "snapshot", "create", randomFiles(1, 1<<10))
		Expect(err).NotTo(HaveOccurred(), out)
	})
})
