package kubevirt

import (
	"context"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/test/story"
)

// stockConfig is an owner's cloud-config for a stock cloud image: a file to
// back up and a report of what the guest did, then power off. A guest that
// refused its client never attempts a snapshot: the report waits, bounded,
// for its status instead.
func stockConfig(waitFor string) string {
	prelude := story.ReportPrelude
	if waitFor != "" {
		prelude = strings.Replace(prelude, "! [ -e /var/lib/guestbackup/last-snapshot-attempt ]",
			"! grep -q '"+waitFor+"' /var/lib/guestbackup/status 2>/dev/null", 1)
	}
	return `#cloud-config
write_files:
- path: /srv/app/config.ini
  content: "[app]\nname = stock\n"
- path: /usr/local/sbin/report
  permissions: '0755'
  content: |
    ` + prelude + `    say "kopia $(command -v kopia || echo none)"
    say "client $(sha256sum /usr/local/lib/guestbackup/kopia 2>/dev/null | cut -d' ' -f1)"
    say "snapshots $(guestbackup-kopia snapshot list --json /srv/app 2>/dev/null | grep -c '"id"')"
    systemctl poweroff
runcmd:
- [systemd-run, --unit=report, --no-block, /usr/local/sbin/report]
`
}

var _ = Describe("Zero touch on a stock cloud image: the server hands the guest its kopia", Ordered, func() {
	const (
		bslsNS = "backup"
		vmNS   = "team-s"
	)
	var (
		ctx context.Context
		bp  backupPlatform
	)
	// create admits an opted-in VM on the stock image and returns it as
	// stored.
	create := func(name, userData string) *kubevirtv1.VirtualMachine {
		GinkgoHelper()
		return story.CreateStored(ctx, bp.API.Client, story.OwnersVM(vmNS, name, bslsNS+"/main", "/srv/app", userData))
	}
	bootStock := func(vm *kubevirtv1.VirtualMachine) testbed.GuestResult {
		GinkgoHelper()
		opts, err := bp.Realise(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		opts.Stock = true
		res := testbed.BootGuest(GinkgoT(), opts)
		GinkgoWriter.Printf("stock guest of VM %s: boot to power off %v (%v of qemu's CPU)\n", vm.Name, res.Elapsed.Round(time.Second), res.CPU.Round(time.Second))
		return res
	}

	BeforeAll(func() {
		testbed.RequireTestBed(GinkgoT())
		if _, err := testbed.LoadStockGuestImage(); err != nil {
			Fail(err.Error())
		}
		ctx = context.Background()
		bp = startBackupPlatform(ctx, bslsNS, vmNS)
	})

	It("publishes the client it serves in the BSLS's status", func() {
		Eventually(func() *v1alpha1.ClientStatus {
			_ = bp.API.Client.Get(ctx, client.ObjectKeyFromObject(bp.bsls), bp.bsls)
			return bp.bsls.Status.Client
		}).WithTimeout(60 * time.Second).ShouldNot(BeNil())
		Expect(bp.bsls.Status.Client.URL).To(Equal("https://" + testbed.GuestHostAddress + ":" + strconv.Itoa(bp.port+1)))
		Expect(bp.bsls.Status.Client.SHA256).To(HaveKey("amd64"))
		Expect(bp.bsls.Status.Client.SHA256).To(HaveKey("arm64"))
	})

	It("boots a guest without kopia that fetches it, verifies it, connects and snapshots with zero touch", func() {
		vm := create("app", stockConfig(""))
		res := bootStock(vm)
		m := story.Markers(res.Console)
		Expect(m["kopia"]).To(Equal("none"), "the stock image has no kopia of its own")
		Expect(m["client"]).To(Equal(bp.bsls.Status.Client.SHA256["amd64"]), "the guest's services said:\n%s", story.Logs(res.Console))
		Expect(m["status"]).To(ContainSubstring("connected to https://10.0.2.2:"+strconv.Itoa(bp.port)+" as app@team-s"), "the guest's services said:\n%s", story.Logs(res.Console))
		Expect(m["snapshots"]).To(Equal("1"))
		Expect(story.Logs(res.Console)).To(ContainSubstring("fetching kopia " + bp.bsls.Status.Client.Version + " for amd64"))
		Eventually(eventsOfVM(ctx, bp.Platform, vmNS, "app")).WithTimeout(60 * time.Second).Should(ContainElement(HavePrefix("Normal GuestConnected: Guest backs up as app@team-s")))
	})

	It("refuses a client whose SHA-256 is not the bootstrap's, says so in the guest and as an Event on the VM", func() {
		vm := create("tampered", stockConfig("refused"))
		By("giving the guest a bootstrap that expects another build than the server serves")
		key := types.NamespacedName{Namespace: vmNS, Name: v1alpha1.CredentialSecretName("tampered")}
		genuine := bp.bsls.Status.Client.SHA256["amd64"]
		forged := strings.Repeat("0", 64)
		// The controller adopts and hashes the Secret meanwhile: retried
		// on conflicts.
		Eventually(func() error {
			s := &corev1.Secret{}
			if err := bp.API.Client.Get(ctx, key, s); err != nil {
				return err
			}
			// The owner's cloud-config and ours, merged: ours is rewritten.
			parts, err := cloudinit.Parts(s.Data[v1alpha1.SecretKeyUserData])
			Expect(err).NotTo(HaveOccurred())
			Expect(parts).To(HaveLen(2))
			Expect(string(parts[1].Data)).To(ContainSubstring(genuine))
			merged, err := cloudinit.Merge(parts[0].Data, []byte(strings.ReplaceAll(string(parts[1].Data), genuine, forged)))
			Expect(err).NotTo(HaveOccurred())
			s.Data[v1alpha1.SecretKeyUserData] = merged
			return bp.API.Client.Update(ctx, s)
		}).WithTimeout(30 * time.Second).Should(Succeed())

		res := bootStock(vm)
		m := story.Markers(res.Console)
		Expect(m["status"]).To(And(ContainSubstring("error: refused the kopia client"), ContainSubstring("not "+forged), ContainSubstring("it was not run")),
			"the guest's services said:\n%s", story.Logs(res.Console))
		Expect(m["client"]).To(BeEmpty(), "nothing was installed")
		Eventually(eventsOfVM(ctx, bp.Platform, vmNS, "tampered")).WithTimeout(3 * time.Minute).Should(ContainElement(
			And(HavePrefix("Warning ClientChecksumMismatch: Guest refused the kopia client"), ContainSubstring("not "+forged))))
	})
})
