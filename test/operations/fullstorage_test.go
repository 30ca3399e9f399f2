package operations

import (
	"crypto/rand"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/content/index"
	"github.com/kopia/kopia/repo/manifest"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/serverpod/readkeeper"
)

// fullVolumeSize is the claim of the full-storage spec: small, so that a
// guest fills it in seconds.
const fullVolumeSize = 48 << 20

// reserveIn is the size of the server pod's reserve (readkeeper.ReserveName)
// somewhere under claim, 0 while there is none.
func reserveIn(claim string) int64 {
	var size int64
	_ = filepath.WalkDir(claim, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == readkeeper.ReserveName {
			if info, err := d.Info(); err == nil {
				size = info.Size()
			}
		}
		return nil
	})
	return size
}

// repositoryView is the claim's repository as an admin holding the
// repository password sees it, from outside the product.
type repositoryView struct {
	configFile, password string
}

// viewRepository connects to b's repository under claim with the password
// of b's Secret.
func (c *cluster) viewRepository(b *v1alpha1.BackupStorageLocationServer, claim string) repositoryView {
	GinkgoHelper()
	sel := kopiaserver.RepositoryPassword(b)
	secret := &corev1.Secret{}
	Expect(c.API.Client.Get(ctx, client.ObjectKey{Namespace: b.Namespace, Name: sel.Name}, secret)).To(Succeed())
	var path string
	Expect(filepath.WalkDir(claim, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "kopia.repository.f" {
			path = filepath.Dir(p)
			return filepath.SkipAll
		}
		return err
	})).To(Succeed())
	Expect(path).NotTo(BeEmpty(), "no repository under %s", claim)
	st, err := filesystem.New(ctx, &filesystem.Options{Path: path}, false)
	Expect(err).NotTo(HaveOccurred())
	v := repositoryView{configFile: filepath.Join(GinkgoT().TempDir(), "repository.config"), password: string(secret.Data[sel.Key])}
	Expect(repo.Connect(ctx, v.configFile, st, v.password, &repo.ConnectOptions{})).To(Succeed())
	return v
}

// manifestContents counts the repository's manifest contents, as the Kopia
// server's next load finds them.
func (v repositoryView) manifestContents() int {
	GinkgoHelper()
	r, err := repo.Open(ctx, v.configFile, v.password, &repo.Options{})
	Expect(err).NotTo(HaveOccurred())
	defer r.Close(ctx) //nolint:errcheck // read only
	n := 0
	Expect(r.(repo.DirectRepository).ContentReader().IterateContents(ctx,
		content.IterateOptions{Range: index.PrefixRange(manifest.ContentPrefix)},
		func(content.Info) error { n++; return nil })).To(Succeed())
	return n
}

var _ = Describe("A filesystem BSLS whose volume one guest filled", func() {
	It("lets the other guest list and restore its snapshot while no byte can be written, and snapshot again once space is back", func() {
		c, b, port := startBSLS()
		claim := testbed.SmallVolume(GinkgoT(), fullVolumeSize)
		c.UseClaim(b, claim)
		c.serve(b, port)

		By("two guests connect: the owner of precious data, and a noisy one")
		noisyName := "noisy"
		Expect(c.API.Client.Create(ctx, newVM())).To(Succeed())
		Expect(c.API.Client.Create(ctx, testbed.SmallVM(vmNamespace, noisyName, map[string]string{v1alpha1.AnnotationServer: storageNamespace + "/" + bslsName}))).To(Succeed())
		var victim, noisy *testbed.KopiaClient
		Eventually(func() (err error) {
			victim, err = connect(install(c.vmSecret()))
			return err
		}).WithTimeout(provisionTimeout).WithPolling(2 * time.Second).Should(Succeed())
		Eventually(func() (err error) {
			noisy, err = connect(install(c.secretOf(noisyName)))
			return err
		}).WithTimeout(provisionTimeout).WithPolling(2 * time.Second).Should(Succeed())

		content := []byte("what the owner must never lose\n")
		source := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(source, "precious.txt"), content, 0o600)).To(Succeed())
		out, err := victim.Run(ctx, "snapshot", "create", source)
		Expect(err).NotTo(HaveOccurred(), out)
		ids, err := victim.SnapshotIDs(ctx, source)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))

		By("the server pod holds its reserve on the claim")
		Eventually(func() int64 { return reserveIn(claim) }).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).
			Should(BeNumerically(">=", readkeeper.ReserveSize(0)))

		By("the noisy guest snapshots again and again, then takes the whole volume")
		noise := GinkgoT().TempDir()
		write := func(name string, size int64) {
			data := make([]byte, size)
			_, _ = rand.Read(data)
			Expect(os.WriteFile(filepath.Join(noise, name), data, 0o600)).To(Succeed())
		}
		// Until 15 manifest contents wait: the big snapshot below makes the
		// 16th, which only a write can compact. The server pod's minute
		// may compact in between (at 8); the noisy guest goes on.
		view := c.viewRepository(b, claim)
		for i := 0; view.manifestContents() != readkeeper.KopiaThreshold-1; i++ {
			Expect(i).To(BeNumerically("<", 100), "snapshots that never left 15 manifest contents")
			write(fmt.Sprintf("f%d", i), 1000)
			out, err := noisy.Run(ctx, "snapshot", "create", noise)
			Expect(err).NotTo(HaveOccurred(), out)
		}
		free, err := testbed.FreeBytes(claim)
		Expect(err).NotTo(HaveOccurred())
		write("big", free*3/4)
		out, err = noisy.Run(ctx, "snapshot", "create", noise)
		Expect(err).NotTo(HaveOccurred(), out)
		ballast, err := testbed.FillVolume(claim, 0)
		Expect(err).NotTo(HaveOccurred())
		GinkgoLogr.Info("volume full", "manifestContents", view.manifestContents())
		write("more", 1000)
		out, err = noisy.Run(ctx, "snapshot", "create", noise)
		Expect(err).To(HaveOccurred(), "a snapshot on a full volume: %s", out)

		By("the owner lists and restores its snapshot")
		// After the server pod's next compaction, in its reserve's space
		// (at most a minute), unless it compacted since the big snapshot.
		Eventually(func() error {
			_, err := victim.SnapshotIDs(ctx, source)
			return err
		}).WithTimeout(3 * time.Minute).WithPolling(5 * time.Second).Should(Succeed())
		restoreAndCompare(victim, ids[0], content)

		By("space comes back: both guests snapshot again, with nothing done in the guest")
		Expect(os.Remove(ballast)).To(Succeed())
		out, err = victim.Run(ctx, "snapshot", "create", source)
		Expect(err).NotTo(HaveOccurred(), out)
		out, err = noisy.Run(ctx, "snapshot", "create", noise)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(victim.SnapshotIDs(ctx, source)).To(HaveLen(2))
	})
})
