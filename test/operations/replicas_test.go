package operations

import (
	"os"
	"path/filepath"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// seenWithin bounds how long a snapshot written through one server pod
// may stay unseen through another: docs/design.md, decision 26, asks for 5 s on
// a cluster (kopiaserver.ReplicaRefreshInterval and one refresh); this is
// generous for CI's busy cores, and far below Kopia's own 4 h.
const seenWithin = 45 * time.Second

// replicas is how many server pods the BSLS of this file runs: more than
// two, so that a pod that read what another wrote is not taken for one
// that reads everything (pkg/kopiaserver's S3 specs run two).
const replicas = 3

// Replicas agree (docs/design.md, decision 26): a BSLS's replicas share one
// repository, and each serves from what it last read of it. What a guest
// wrote through one pod is listed, verifiable and restorable through every
// other, as a Service balancing over them would send the guest's next
// command to any.
var _ = Describe("A BSLS with three server pods on one shared claim", Ordered, func() {
	var (
		c *cluster
		// through are the guest's clients of each pod.
		through [replicas]*testbed.KopiaClient
		// written are the sources the specs snapshotted, each once.
		written []string
	)

	BeforeAll(func() {
		c = startCluster()
		c.createNamespaces()
		first, err := testbed.FreePorts(2 * replicas)
		Expect(err).NotTo(HaveOccurred())
		// Each pod's server port and, next to it, its client port.
		var ports [replicas]int
		for i := range ports {
			ports[i] = first + 2*i
		}
		b := newBSLS(ports[0])
		b.Spec.Replicas = ptr.To(int32(replicas))
		Expect(c.API.Client.Create(ctx, b)).To(Succeed())
		for _, port := range ports {
			_, err := c.ServeBSLS(ctx, c, b, port)
			Expect(err).NotTo(HaveOccurred())
		}
		key := types.NamespacedName{Namespace: b.Namespace, Name: kopiaserver.DeploymentName(b)}
		Expect(testbed.MarkReplicasAvailable(ctx, c.API, key, replicas, readyTimeout)).To(Succeed())
		Eventually(func() []metav1.Condition {
			Expect(c.API.Client.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
			return b.Status.Conditions
		}).WithTimeout(readyTimeout).Should(ContainElement(And(
			HaveField("Type", v1alpha1.ConditionReady), HaveField("Status", metav1.ConditionTrue))), "BSLS Ready with every pod")

		Expect(c.API.Client.Create(ctx, newVM())).To(Succeed())
		var files guestFiles
		Eventually(func() error {
			files = install(c.vmSecret())
			var err error
			through[0], err = connect(files)
			return err
		}).WithTimeout(provisionTimeout).WithPolling(2*time.Second).Should(Succeed(), "the guest logs in through the first pod")
		Expect(files.URL).To(Equal("https://127.0.0.1:" + strconv.Itoa(ports[0])))
		// The same guest, its next commands balanced to the other pods.
		for i := 1; i < replicas; i++ {
			files.URL = "https://127.0.0.1:" + strconv.Itoa(ports[i])
			Eventually(func() error {
				var err error
				through[i], err = connect(files)
				return err
			}).WithTimeout(provisionTimeout).WithPolling(2*time.Second).Should(Succeed(), "the guest logs in through pod %d", i)
		}
	})

	// Round the ring: each pod writes once and each reads once what
	// another wrote.
	for _, tt := range []struct {
		name      string
		from, via int
	}{
		{"from the first pod to the second", 0, 1},
		{"from the second pod to the third", 1, 2},
		{"from the third pod to the first", 2, 0},
	} {
		It("lists, verifies and restores a snapshot "+tt.name, func() {
			source := GinkgoT().TempDir()
			written = append(written, source)
			content := []byte("written through pod " + strconv.Itoa(tt.from) + "\n")
			Expect(os.WriteFile(filepath.Join(source, "data.txt"), content, 0o600)).To(Succeed())
			out, err := through[tt.from].Run(ctx, "snapshot", "create", source)
			Expect(err).NotTo(HaveOccurred(), out)
			ids, err := through[tt.from].SnapshotIDs(ctx, source)
			Expect(err).NotTo(HaveOccurred())
			Expect(ids).To(HaveLen(1))

			Eventually(func() ([]string, error) { return through[tt.via].SnapshotIDs(ctx, source) }).
				WithTimeout(seenWithin).WithPolling(time.Second).Should(Equal(ids), "listed through the other pod")
			out, err = through[tt.via].Run(ctx, "snapshot", "verify", "--verify-files-percent=100", ids[0])
			Expect(err).NotTo(HaveOccurred(), "verified through the other pod: %s", out)
			target := filepath.Join(GinkgoT().TempDir(), "restored")
			out, err = through[tt.via].Run(ctx, "restore", ids[0], target)
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(os.ReadFile(filepath.Join(target, "data.txt"))).To(Equal(content), "restored byte for byte through the other pod")
		})
	}

	// What a guest reconnecting through any pod sees never shrinks: every
	// pod lists every snapshot acknowledged through any.
	It("lists every snapshot through every pod", func() {
		Expect(written).To(HaveLen(replicas), "the ring's specs ran first")
		for i, client := range through {
			for _, source := range written {
				Eventually(func() ([]string, error) { return client.SnapshotIDs(ctx, source) }).
					WithTimeout(seenWithin).WithPolling(time.Second).Should(HaveLen(1), "%s listed through pod %d", source, i)
			}
		}
	})
})
