package operations

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/repo/content"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/rehash"
	"github.com/guestbackup/guestbackup/pkg/serverpod/integrity"
)

const (
	// verifyEvery is the BSLS's spec.maintenance.verifyInterval. An admin
	// keeps the default (10m); the spec needs several passes within its
	// patience: one that finds the repository intact, one that finds each
	// loss, and one that finds it healed. Passes this close together also
	// run while the guests snapshot, as they do over a repository's years.
	verifyEvery = 5 * time.Second
	// toldWithin bounds how long after the storage lost or rotted a pack
	// the admin is told: a pass's interval and its work, generous for CI's
	// busy cores.
	toldWithin = 2 * time.Minute
	// guestCommandTimeout bounds one of the guest's scripts or kopia
	// commands.
	guestCommandTimeout = 3 * time.Minute
	// db is the second VM, in the same namespace: the control, whose
	// snapshots share no pack with what the storage loses.
	db = "db"
)

// Verification (docs/design.md, decision 27) with the product as it runs:
// the storage under a BSLS loses a pack, and rots another. Without
// verification, every later backup of the same files reports success and
// cannot be read back, and nothing says so. With it, the server pod that
// runs maintenance names the pack in a Warning Event on the BSLS and in the
// state it publishes for the controller, and the guests whose snapshots
// reference it read their files again at their next snapshot, which uploads
// what was lost: every snapshot of those files, the earlier ones too,
// verifies and restores again.
//
// The guests run the bootstrap's own scripts, as the real cloud-init
// installed them from their VMs' Secrets: the connect script (which installs
// the kopia client the server hands out), and the snapshot script their
// timer runs, which reads the server's rehash notice.
var _ = Describe("A BSLS whose storage loses a pack, then rots another", Ordered, func() {
	var (
		c            *cluster
		bsls         *v1alpha1.BackupStorageLocationServer
		store        *storageView
		web, dbGuest *bootedGuest
		// The folders the web VM backs up: lost loses its pack, rotten
		// has one rot, kept shares no pack with either.
		lost, rotten, kept string
		// dbData is the folder the db VM backs up.
		dbData string
	)

	// events are the Events on the BSLS, as "Type Reason: message".
	events := func() ([]string, error) {
		return c.Events(ctx, storageNamespace, "BackupStorageLocationServer", bslsName)
	}
	// state is the integrity the server pod last published in the BSLS's
	// maintenance ConfigMap, for the controller.
	state := func() (*maintenancestate.IntegrityState, error) {
		cm := &corev1.ConfigMap{}
		key := types.NamespacedName{Namespace: storageNamespace, Name: maintenancestate.ConfigMapName(bslsName)}
		if err := c.API.Client.Get(ctx, key, cm); err != nil {
			return nil, err
		}
		s, err := maintenancestate.DecodeIntegrity(cm.Data[maintenancestate.IntegrityKey])
		if err == nil && s == nil {
			err = fmt.Errorf("ConfigMap %s holds no %q yet", key, maintenancestate.IntegrityKey)
		}
		return s, err
	}
	// published says what the server pod last published, for a spec
	// that waited in vain.
	published := func() string {
		s, err := state()
		data, _ := json.Marshal(s)
		return fmt.Sprintf("the server pod last published %s (%v)", data, err)
	}
	// damagedBy matches a Warning RepositoryDamaged Event naming pack.
	damagedBy := func(pack blob.ID) OmegaMatcher {
		return And(HavePrefix("Warning "+integrity.ReasonRepositoryDamaged+": "), ContainSubstring(string(pack)))
	}
	intactAgain := HavePrefix("Normal " + integrity.ReasonRepositoryIntactAgain + ": ")
	// vmEvents are the Events on the web VM, which its owner reads.
	vmEvents := func() ([]string, error) {
		return c.Events(ctx, vmNamespace, "VirtualMachine", vmName)
	}
	// intact is the BSLS's RepositoryIntact condition.
	intact := func() (*metav1.Condition, error) {
		b := &v1alpha1.BackupStorageLocationServer{}
		if err := c.API.Client.Get(ctx, types.NamespacedName{Namespace: storageNamespace, Name: bslsName}, b); err != nil {
			return nil, err
		}
		return meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionRepositoryIntact), nil
	}

	BeforeAll(func() {
		var b *v1alpha1.BackupStorageLocationServer
		var port int
		c, b, port = startBSLS()
		b.Spec.Repository.Maintenance = &v1alpha1.MaintenanceSpec{
			VerifyInterval: &metav1.Duration{Duration: verifyEvery},
			// More than the repository holds: every pass reads every pack
			// back, so that the rot is found by the first pass after it.
			VerifyReadBytes: ptr.To(resource.MustParse("1Gi")),
		}
		_, bsls = c.serve(b, port)

		lost, rotten, kept, dbData = randomFiles(4, 2<<20), randomFiles(3, 1<<20), randomFiles(3, 1<<20), randomFiles(2, 1<<20)
		for name, paths := range map[string][]string{vmName: {lost, rotten, kept}, db: {dbData}} {
			Expect(c.API.Client.Create(ctx, testbed.SmallVM(vmNamespace, name, map[string]string{
				v1alpha1.AnnotationServer: storageNamespace + "/" + bslsName,
				// The webhook renders them into the guest's paths file,
				// which its snapshot script reads.
				v1alpha1.AnnotationPaths: strings.Join(paths, ","),
			}))).To(Succeed())
		}
		web, dbGuest = boot(c, vmName), boot(c, db)
		// Their first snapshots, as their timers take them: the paths
		// file lists the annotation's folders.
		out := web.snapshot()
		for _, path := range []string{lost, rotten, kept} {
			Expect(out).To(ContainSubstring("snapshot of " + path + " taken"))
		}
		Expect(dbGuest.snapshot()).To(ContainSubstring("snapshot of " + dbData + " taken"))
		store = openStorage(c, bsls)
	})

	It("verifies the repository on the BSLS's schedule and publishes it intact", func() {
		after := time.Now()
		Eventually(state).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveField("Error", BeEmpty()),
			HaveField("VerifiedAt", BeTemporally(">", after)),
			HaveField("Contents", BeNumerically(">", 0)),
			HaveField("ReadBytes", BeNumerically(">", 0)),
			HaveField("LostContents", 0),
			HaveField("DamagedSnapshots", 0),
		), "a pass after the guests' first snapshots")
		Expect(events()).NotTo(ContainElement(Or(
			HavePrefix("Warning "+integrity.ReasonRepositoryDamaged+": "),
			HavePrefix("Warning "+integrity.ReasonVerificationFailing+": "),
		)), "an intact repository, verified, raises no warning")
	})

	It("names a pack the storage lost, asks only its guest to read its files again, and the guest's next snapshot makes every snapshot of them whole", func() {
		packs := store.dataPacks(vmName, vmNamespace, lost)
		Expect(packs).NotTo(BeEmpty())

		By("the storage loses the packs holding the files of " + lost + " (a lifecycle rule, a storage admin's mistake)")
		for _, p := range packs {
			Expect(store.DeleteBlob(ctx, p)).To(Succeed())
		}
		deleted := time.Now()

		By("without verification: a plain snapshot of the same files reports success and cannot be read back")
		// Kopia's client keeps an unchanged file's previous entries
		// without reading it: this snapshot references the lost data
		// whether or not a pass has run yet. Only reading the files again
		// heals, which is what the snapshot script's notice is for.
		web.kopia("snapshot", "create", lost)
		ids := web.snapshotIDs(lost)
		Expect(ids).To(HaveLen(2))
		out, err := web.verify(ids...)
		Expect(err).To(HaveOccurred(), "the snapshots of %s verify with their pack deleted:\n%s", lost, out)

		By("the admin is told: a Warning Event on the BSLS names the pack")
		Eventually(events).WithTimeout(toldWithin).WithPolling(time.Second).Should(ContainElement(damagedBy(packs[0])), published)
		report("from the pack's deletion to the RepositoryDamaged Event", time.Since(deleted))

		By("the published state names the pack, and the damaged snapshots of that folder of that guest only, which heals")
		Eventually(state).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveField("Error", BeEmpty()),
			HaveField("MissingPacks", ConsistOf(toStrings(packs))),
			HaveField("DamagedPacks", BeEmpty()),
			// Absent from the index, not merely marked deleted: the
			// guest's client uploads what it does not find.
			HaveField("Pending", 0),
			HaveField("DamagedSnapshots", 2),
			HaveField("Damaged", ConsistOf(And(
				HaveField("User", vmName), HaveField("Host", vmNamespace), HaveField("Path", lost),
				HaveField("Snapshots", 2), HaveField("Files", 4), HaveField("Healing", true),
				HaveField("IDs", ConsistOf(ids)),
			))),
		))

		By("the BSLS's RepositoryIntact turns False, and the VM's owner gets a Warning naming the folder")
		Eventually(intact).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kopiaserver.ReasonContentsLost),
			HaveField("Message", ContainSubstring(string(packs[0]))),
		))
		Eventually(vmEvents).WithTimeout(toldWithin).WithPolling(time.Second).Should(ContainElement(And(
			HavePrefix("Warning "+kopiaserver.ReasonBackupDamaged+": "), ContainSubstring(lost),
		)))

		By("the guest, and no other, finds a rehash notice in the repository")
		Eventually(web.notices).WithTimeout(toldWithin).WithPolling(time.Second).ShouldNot(BeEmpty())
		Expect(dbGuest.notices()).To(BeEmpty())

		By("what shared no pack with the loss stays whole: the other folder, and the other guest")
		web.mustVerify(web.snapshotIDs(kept)...)
		dbGuest.mustVerify(dbGuest.snapshotIDs(dbData)...)

		By("the guest's own snapshot script, as its timer runs it, reads every file again")
		Expect(web.snapshot()).To(ContainSubstring("the server asks to read every file again"))
		Expect(dbGuest.snapshot()).NotTo(ContainSubstring("read every file again"), "the other guest was not asked")

		By("every snapshot of the folder verifies, those taken before the loss too, and the first restores byte for byte")
		ids = web.snapshotIDs(lost)
		Expect(ids).To(HaveLen(3))
		web.mustVerify(ids...)
		web.restoresAs(ids[0], lost)

		By("the admin is told the repository is intact again, and the notice is gone")
		Eventually(events).WithTimeout(toldWithin).WithPolling(time.Second).Should(ContainElement(intactAgain))
		report("from the pack's deletion to the RepositoryIntactAgain Event", time.Since(deleted))
		Eventually(state).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveField("Error", BeEmpty()), HaveField("DamagedSnapshots", 0), HaveField("Damaged", BeEmpty()),
		))
		Eventually(web.notices).WithTimeout(toldWithin).WithPolling(time.Second).Should(BeEmpty())
		Eventually(intact).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kopiaserver.ReasonIntact),
		))
		Eventually(vmEvents).WithTimeout(toldWithin).WithPolling(time.Second).Should(ContainElement(And(
			HavePrefix("Normal "+kopiaserver.ReasonBackupHealed+": "), ContainSubstring(lost),
		)))
	})

	It("finds a pack whose bytes rotted by reading it back, names it, and the guest's next snapshot makes every snapshot of them whole", func() {
		packs := store.dataPacks(vmName, vmNamespace, rotten)
		Expect(packs).NotTo(BeEmpty())
		pack := packs[0]
		healed, err := countOf(events, intactAgain)
		Expect(err).NotTo(HaveOccurred())
		Expect(healed).To(Equal(1), "the loss healed once")

		By("9 runs of 64 bytes rot inside " + string(pack) + ", which keeps its name and length")
		store.rot(pack)
		rotted := time.Now()
		ids := web.snapshotIDs(rotten)
		out, err := web.verify(ids...)
		Expect(err).To(HaveOccurred(), "the snapshots of %s verify with their pack rotten:\n%s", rotten, out)

		By("the admin is told: a Warning Event on the BSLS names the pack")
		Eventually(events).WithTimeout(toldWithin).WithPolling(time.Second).Should(ContainElement(damagedBy(pack)), published)
		report("from the rot to the RepositoryDamaged Event", time.Since(rotted))
		Eventually(state).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveField("Error", BeEmpty()),
			HaveField("MissingPacks", BeEmpty()),
			HaveField("DamagedPacks", ConsistOf(string(pack))),
			HaveField("Pending", 0),
			HaveField("Damaged", ConsistOf(And(
				HaveField("User", vmName), HaveField("Host", vmNamespace), HaveField("Path", rotten),
				HaveField("Snapshots", len(ids)), HaveField("Files", And(BeNumerically(">", 0), BeNumerically("<=", 3))),
				HaveField("Healing", true),
			))),
		))
		Eventually(web.notices).WithTimeout(toldWithin).WithPolling(time.Second).ShouldNot(BeEmpty())
		web.mustVerify(web.snapshotIDs(kept)...)
		web.mustVerify(web.snapshotIDs(lost)...)
		dbGuest.mustVerify(dbGuest.snapshotIDs(dbData)...)

		By("the guest's snapshot script reads every file again; every snapshot of the folder verifies, and the first restores byte for byte")
		Expect(web.snapshot()).To(ContainSubstring("the server asks to read every file again"))
		ids = web.snapshotIDs(rotten)
		web.mustVerify(ids...)
		web.restoresAs(ids[0], rotten)

		By("the admin is told the repository is intact again")
		Eventually(func() (int, error) { return countOf(events, intactAgain) }).
			WithTimeout(toldWithin).WithPolling(time.Second).Should(Equal(healed + 1))
		report("from the rot to the RepositoryIntactAgain Event", time.Since(rotted))
		Eventually(state).WithTimeout(toldWithin).WithPolling(time.Second).Should(And(
			HaveField("Error", BeEmpty()), HaveField("DamagedSnapshots", 0), HaveField("Damaged", BeEmpty()),
		))
		Expect(dbGuest.notices()).To(BeEmpty(), "the other guest never had a notice")
	})
})

// report records a figure of the spec in its report, and says it.
func report(what string, d time.Duration) {
	d = d.Round(100 * time.Millisecond)
	AddReportEntry(what, d.String())
	GinkgoWriter.Printf("%s: %s\n", what, d)
}

// countOf is how many of the elements list returns m matches.
func countOf(list func() ([]string, error), m OmegaMatcher) (int, error) {
	items, err := list()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range items {
		if ok, err := m.Match(s); err == nil && ok {
			n++
		}
	}
	return n, nil
}

// bootedGuest is a VM's guest as its bootstrap made it: the files the real
// cloud-init installed from the VM's Secret under a folder standing for
// its /, and the bootstrap's own scripts run from there, with the test
// bed's kopia as the guest's own.
type bootedGuest struct {
	files guestFiles
	// own is the kopia the guest comes with; the connect script installs
	// the client its server hands out (a copy of own when it is that very
	// build, else a download from the server), and the scripts run that.
	own string
}

// boot installs the bootstrap of VM name of vmNamespace and runs its
// connect script, as the guest's first boot does, until the guest is
// connected: the controller creates its user shortly after the webhook
// admitted the VM.
func boot(c *cluster, name string) *bootedGuest {
	GinkgoHelper()
	g := &bootedGuest{own: testbed.MustTools(GinkgoT()).Kopia}
	Eventually(func() (string, error) {
		g.files = install(c.secretOf(name))
		return g.run(cloudinit.ConnectScript)
	}).WithTimeout(provisionTimeout).WithPolling(2*time.Second).Should(ContainSubstring("connected to"), "the guest of %s connects with its bootstrap", name)
	Expect(g.files.User + "@" + g.files.Host).To(Equal(name + "@" + vmNamespace))
	return g
}

// run runs one of the bootstrap's scripts with args, as root in the guest.
func (g *bootedGuest) run(script string, args ...string) (string, error) {
	root := g.files.Root
	env := []string{
		"GUESTBACKUP_CONF_DIR=" + filepath.Join(root, cloudinit.ConfDir),
		"GUESTBACKUP_STATE_DIR=" + filepath.Join(root, cloudinit.StateDir),
		"GUESTBACKUP_LIB_DIR=" + filepath.Join(root, cloudinit.LibDir),
		"GUESTBACKUP_ROOT=" + root,
		// One attempt: boot polls on the spec's clock, not the script's
		// backoff.
		"GUESTBACKUP_ATTEMPTS=1",
		"KOPIA=" + g.own,
	}
	// HOME is root (testbed.Run's default): kopia's configuration is the
	// guest's root's.
	return testbed.Run(ctx, guestCommandTimeout, root, env, filepath.Join(root, script), args...)
}

// kopia runs kopia as the guest's owner does, with the bootstrap's
// guestbackup-kopia, and expects it to succeed.
func (g *bootedGuest) kopia(args ...string) string {
	GinkgoHelper()
	out, err := g.run(cloudinit.KopiaCommand, args...)
	Expect(err).NotTo(HaveOccurred(), "kopia %s:\n%s", strings.Join(args, " "), out)
	return out
}

// snapshot runs the snapshot script, as the guest's timer does, and
// returns what it said.
func (g *bootedGuest) snapshot() string {
	GinkgoHelper()
	out, err := g.run(cloudinit.SnapshotScript)
	Expect(err).NotTo(HaveOccurred(), "the snapshot script:\n%s", out)
	return out
}

// snapshotIDs are the IDs of the guest's snapshots of path, oldest first.
func (g *bootedGuest) snapshotIDs(path string) []string {
	GinkgoHelper()
	var snapshots []struct {
		ID string `json:"id"`
	}
	Expect(json.Unmarshal([]byte(g.kopia("snapshot", "list", "--json", path)), &snapshots)).To(Succeed())
	ids := make([]string, len(snapshots))
	for i, s := range snapshots {
		ids[i] = s.ID
	}
	return ids
}

// verify reads every file of the snapshots ids back, as the guest.
func (g *bootedGuest) verify(ids ...string) (string, error) {
	return g.run(cloudinit.KopiaCommand, append([]string{"snapshot", "verify", "--verify-files-percent=100"}, ids...)...)
}

// mustVerify expects the snapshots ids, at least one, to verify.
func (g *bootedGuest) mustVerify(ids ...string) {
	GinkgoHelper()
	Expect(ids).NotTo(BeEmpty())
	out, err := g.verify(ids...)
	Expect(err).NotTo(HaveOccurred(), "snapshot verify --verify-files-percent=100 %s:\n%s", strings.Join(ids, " "), out)
}

// notices is what the guest's snapshot script reads of its rehash
// notices: the server names the guest in one while it must read every file
// again.
func (g *bootedGuest) notices() string {
	GinkgoHelper()
	return strings.TrimSpace(g.kopia("manifest", "list", "--filter=type:"+rehash.ManifestType))
}

// restoresAs restores snapshot id as the guest and expects it to hold
// exactly the files of dir, byte for byte.
func (g *bootedGuest) restoresAs(id, dir string) {
	GinkgoHelper()
	target := filepath.Join(GinkgoT().TempDir(), "restored")
	g.kopia("snapshot", "restore", id, target)
	want, err := os.ReadDir(dir)
	Expect(err).NotTo(HaveOccurred())
	got, err := os.ReadDir(target)
	Expect(err).NotTo(HaveOccurred())
	Expect(len(got)).To(Equal(len(want)), "files restored from %s", id)
	for _, e := range want {
		w, err := os.ReadFile(filepath.Join(dir, e.Name()))
		Expect(err).NotTo(HaveOccurred())
		r, err := os.ReadFile(filepath.Join(target, e.Name()))
		Expect(err).NotTo(HaveOccurred())
		Expect(bytes.Equal(r, w)).To(BeTrue(), "%s restored from %s is not byte for byte what was backed up", e.Name(), id)
	}
}

// randomFiles writes n files of size random bytes into a new folder, which
// no other folder's data deduplicates against.
func randomFiles(n, size int) string {
	GinkgoHelper()
	dir := GinkgoT().TempDir()
	for i := range n {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		Expect(os.WriteFile(filepath.Join(dir, "file"+strconv.Itoa(i)), data, 0o600)).To(Succeed())
	}
	return dir
}

// storageView is what reaches the storage beneath Kopia: Kopia's own
// filesystem blob storage on the BSLS's claim, as a lifecycle rule, a
// storage admin or rot would touch it, and the repository opened read-only
// with its password, to tell which pack holds which file.
type storageView struct {
	blob.Storage
	repo repo.DirectRepository
}

// openStorage opens the repository of bsls on its claim.
func openStorage(c *cluster, bsls *v1alpha1.BackupStorageLocationServer) *storageView {
	GinkgoHelper()
	ref := kopiaserver.RepositoryPassword(bsls)
	s := &corev1.Secret{}
	Expect(c.API.Client.Get(ctx, client.ObjectKey{Namespace: bsls.Namespace, Name: ref.Name}, s)).To(Succeed())
	password := string(s.Data[ref.Key])
	dir := filepath.Join(c.Claim(bsls), bsls.Spec.Repository.PathPrefix)
	st, err := filesystem.New(ctx, &filesystem.Options{Path: dir}, false)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = st.Close(ctx) })
	local := GinkgoT().TempDir()
	config := filepath.Join(local, "repository.config")
	Expect(repo.Connect(ctx, config, st, password, &repo.ConnectOptions{
		CachingOptions: content.CachingOptions{CacheDirectory: filepath.Join(local, "cache")},
		ClientOptions:  repo.ClientOptions{Username: "storage-admin", Hostname: "spec", ReadOnly: true},
	})).To(Succeed())
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = r.Close(ctx) })
	dr, ok := r.(repo.DirectRepository)
	Expect(ok).To(BeTrue())
	return &storageView{Storage: st, repo: dr}
}

// dataPacks are the packs holding the file data of the latest snapshot of
// user@host:path (a folder of files).
func (v *storageView) dataPacks(user, host, path string) []blob.ID {
	GinkgoHelper()
	packs, err := testbed.DataPacks(ctx, v.repo, user, host, path)
	Expect(err).NotTo(HaveOccurred())
	return packs
}

// rot flips bytes inside pack, as storage that rots does: its name and
// length stay, its contents do not decrypt.
func (v *storageView) rot(pack blob.ID) {
	GinkgoHelper()
	Expect(testbed.RotBlob(ctx, v, pack)).To(Succeed())
}

// toStrings is packs as the state lists them.
func toStrings(packs []blob.ID) []string {
	out := make([]string, len(packs))
	for i, p := range packs {
		out[i] = string(p)
	}
	return out
}
