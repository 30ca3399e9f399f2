package readkeeper_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/content/index"
	"github.com/kopia/kopia/repo/manifest"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/readkeeper"
)

// volumeSize is the storage's volume: small, so that a guest fills it in
// seconds.
const volumeSize = 32 << 20

// manifestContents counts the repository's manifest contents, as the Kopia
// server's next load will find them.
func manifestContents(ctx context.Context, r repo.Repository) int {
	GinkgoHelper()
	Expect(r.Refresh(ctx)).To(Succeed())
	n := 0
	Expect(r.(repo.DirectRepository).ContentReader().IterateContents(ctx,
		content.IterateOptions{Range: index.PrefixRange(manifest.ContentPrefix)},
		func(content.Info) error { n++; return nil })).To(Succeed())
	return n
}

// snapshotOf snapshots dir as client c and fails the spec on an error.
func snapshotOf(ctx context.Context, c *testbed.KopiaClient, dir string) {
	GinkgoHelper()
	out, err := c.Run(ctx, "snapshot", "create", dir)
	Expect(err).NotTo(HaveOccurred(), out)
}

// randomFile writes size random bytes (which no storage compresses or
// deduplicates) to path.
func randomFile(path string, size int) {
	GinkgoHelper()
	b := make([]byte, size)
	_, _ = rand.Read(b)
	Expect(os.WriteFile(path, b, 0o600)).To(Succeed())
}

var _ = Describe("A guest's reads on a storage another guest filled", func() {
	var (
		ctx    context.Context
		volume string
		server *testbed.KopiaServer
		// pod is the server pod's own connection to the repository.
		pod            repo.Repository
		control        *serverpod.ControlClient
		victim, filler *testbed.KopiaClient
	)

	BeforeEach(func() {
		ctx = context.Background()
		volume = testbed.SmallVolume(GinkgoT(), volumeSize)
		server = testbed.StartKopiaServer(GinkgoT(), testbed.KopiaServerOptions{RepoPath: filepath.Join(volume, "repository")})
		var err error
		pod, err = repo.Open(ctx, server.ConfigFile, server.RepoPassword, &repo.Options{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(pod.Close(context.Background())).To(Succeed()) })
		control = serverpod.NewControlClient(server.URL, testbed.ControlUsername, server.ControlPassword, []*x509.Certificate{server.CA.Cert})
		DeferCleanup(control.Close)

		victimPassword, fillerPassword := testbed.RandomPassword(), testbed.RandomPassword()
		server.AddUser(GinkgoT(), "victim@guests", victimPassword)
		server.AddUser(GinkgoT(), "filler@guests", fillerPassword)
		victim, filler = testbed.NewKopiaClient(GinkgoT()), testbed.NewKopiaClient(GinkgoT())
		out, err := victim.Connect(ctx, server.URL, server.CA.CertPEM(), "victim@guests", victimPassword)
		Expect(err).NotTo(HaveOccurred(), out)
		out, err = filler.Connect(ctx, server.URL, server.CA.CertPEM(), "filler@guests", fillerPassword)
		Expect(err).NotTo(HaveOccurred(), out)
	})

	// backUp is the victim's snapshot of its precious data, in the folder
	// it returns.
	backUp := func() string {
		GinkgoHelper()
		precious := GinkgoT().TempDir()
		randomFile(filepath.Join(precious, "precious"), 4096)
		snapshotOf(ctx, victim, precious)
		return precious
	}

	// snapshotAgain is the filler's 11 small snapshots of the folder it
	// returns, one more manifest content each: with the two users and the
	// victim's snapshot, 15 where nothing compacts them.
	snapshotAgain := func() string {
		GinkgoHelper()
		small := GinkgoT().TempDir()
		for i := range 11 {
			randomFile(filepath.Join(small, fmt.Sprintf("f%d", i)), 1000)
			snapshotOf(ctx, filler, small)
		}
		return small
	}

	// takeMost is the filler's snapshot of three quarters of what the
	// volume has left: the 16th manifest content where nothing compacts.
	takeMost := func() {
		GinkgoHelper()
		free, err := testbed.FreeBytes(volume)
		Expect(err).NotTo(HaveOccurred())
		big := GinkgoT().TempDir()
		randomFile(filepath.Join(big, "big"), int(free*3/4))
		snapshotOf(ctx, filler, big)
	}

	// restores is the victim listing its one snapshot of precious and
	// restoring it byte for byte.
	restores := func(precious string) {
		GinkgoHelper()
		ids, err := victim.SnapshotIDs(ctx, precious)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))
		target := filepath.Join(GinkgoT().TempDir(), "restored")
		out, err := victim.Run(ctx, "snapshot", "restore", ids[0], target)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(os.ReadFile(filepath.Join(target, "precious"))).To(Equal(must(os.ReadFile(filepath.Join(precious, "precious")))))
	}

	// Without the Keeper the filler's snapshots leave 16 manifest contents,
	// and the victim's listing fails: "unable to find snapshot manifests:
	// error auto-compacting contents: ... unable to write session marker:
	// ... no space left on device".
	It("lists and restores the victim's snapshots while no byte can be written, and snapshots again once space is back", func() {
		DeferCleanup(readkeeper.Start(ctx, &readkeeper.Keeper{Repository: pod, Server: control, Interval: time.Second, Log: GinkgoLogr}))

		By("the victim backs up; the filler snapshots again and again")
		precious := backUp()
		small := snapshotAgain()
		Eventually(func() int { return manifestContents(ctx, pod) }).Should(BeNumerically("<", readkeeper.Threshold),
			"manifest contents left for the Kopia server to compact on its next load")

		By("the filler takes the whole volume")
		takeMost()
		// The Keeper compacts what takeMost left, in its reserve's space if
		// the volume is short: done before the volume fills, or the space
		// it gives back would take the filler's next snapshot.
		Eventually(func() int { return manifestContents(ctx, pod) }).Should(BeNumerically("<", readkeeper.Threshold))
		ballast, err := testbed.FillVolume(volume, 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(testbed.FreeBytes(volume)).To(BeZero())
		randomFile(filepath.Join(small, "more"), 1000)
		out, err := filler.Run(ctx, "snapshot", "create", small)
		Expect(err).To(HaveOccurred(), "a snapshot on a full volume: %s", out)
		Expect(out).To(ContainSubstring("no space left on device"))
		contents := manifestContents(ctx, pod)

		By("the victim lists and restores its snapshot")
		restores(precious)
		Expect(manifestContents(ctx, pod)).To(Equal(contents), "the reads wrote no manifest content")

		By("space comes back: every guest snapshots again, with nothing done in the guest")
		Expect(os.Remove(ballast)).To(Succeed())
		snapshotOf(ctx, victim, precious)
		snapshotOf(ctx, filler, small)
		Expect(victim.SnapshotIDs(ctx, precious)).To(HaveLen(2))
	})

	// The storage filled up right after the 16th manifest content: no pass
	// came in between. Without the reserve, the victim cannot list until
	// space comes back.
	It("compacts in the reserve's space when the volume filled up before a pass could compact", func() {
		keeper := &readkeeper.Keeper{Repository: pod, Server: control, Log: GinkgoLogr}
		Expect(keeper.Step(ctx)).To(Succeed())
		reserve := filepath.Join(server.RepoPath, readkeeper.ReserveName)
		Expect(os.Stat(reserve)).To(HaveField("Size()", BeNumerically(">=", readkeeper.ReserveSize(0))))

		By("the victim backs up; the filler snapshots until 16 manifest contents wait, and fills the volume")
		precious := backUp()
		snapshotAgain()
		takeMost()
		Expect(manifestContents(ctx, pod)).To(Equal(readkeeper.KopiaThreshold))
		_, err := testbed.FillVolume(volume, 0)
		Expect(err).NotTo(HaveOccurred())

		By("the victim's listing needs a write that the full volume refuses")
		_, err = victim.SnapshotIDs(ctx, precious)
		Expect(err).To(MatchError(ContainSubstring("error auto-compacting contents")))
		Expect(err).To(MatchError(ContainSubstring("no space left on device")))

		By("the Keeper's next step compacts in the reserve's space")
		Expect(keeper.Step(ctx)).To(Succeed())
		Expect(manifestContents(ctx, pod)).To(Equal(1))
		Expect(testbed.FreeBytes(volume)).To(BeNumerically("<", readkeeper.ReserveSize(0)), "the volume is still full but for what is left of the reserve")

		By("the victim lists and restores its snapshot")
		restores(precious)
	})
})

func must(b []byte, err error) []byte {
	GinkgoHelper()
	Expect(err).NotTo(HaveOccurred())
	return b
}
