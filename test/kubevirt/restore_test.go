package kubevirt

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/test/story"
)

// docBlock is one shell block of docs/guest.md that runs in a guest: its
// info string is "sh <tag>".
type docBlock struct{ tag, code string }

var docFence = regexp.MustCompile("(?ms)^```sh (guest[a-z-]*)\n(.*?)^```$")

// guestDocBlocks reads the guest's commands from docs/guest.md, in order,
// so that the guide and what the spec runs cannot drift apart.
func guestDocBlocks() []docBlock {
	GinkgoHelper()
	doc, err := os.ReadFile("../../docs/guest.md")
	Expect(err).NotTo(HaveOccurred())
	var blocks []docBlock
	for _, m := range docFence.FindAllStringSubmatch(string(doc), -1) {
		blocks = append(blocks, docBlock{tag: m[1], code: m[2]})
	}
	return blocks
}

// docRunner is a guest script that runs the blocks tagged tag, each with
// sh -e, saying "block-<tag>-<n> ok" (or failed, with its output) on the
// console; a guest-fuse block runs only where fusermount3 exists.
func docRunner(blocks []docBlock, tags ...string) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\nexport HOME=/root KOPIA_CHECK_FOR_UPDATES=false\nsay() { echo \"GB-E2E $*\" >/dev/console; }\n")
	n := 0
	for _, blk := range blocks {
		want := false
		for _, t := range tags {
			want = want || blk.tag == t
		}
		if !want {
			continue
		}
		n++
		key := fmt.Sprintf("block-%s-%d", blk.tag, n)
		fmt.Fprintf(&b, "printf '%%s' '%s' | base64 -d >/var/tmp/%s.sh\n", base64.StdEncoding.EncodeToString([]byte(blk.code)), key)
		if blk.tag == "guest-fuse" {
			fmt.Fprintf(&b, "if ! command -v fusermount3 >/dev/null; then say '%s skipped: no fusermount3 in this image'; else\n", key)
		}
		fmt.Fprintf(&b, "if sh -e /var/tmp/%[1]s.sh >/var/tmp/%[1]s.out 2>&1; then say '%[1]s ok'; else say \"%[1]s failed $?\"; tail -n 15 /var/tmp/%[1]s.out | sed 's/^/GB-E2E-LOG /' >/dev/console; fi\n", key)
		if blk.tag == "guest-fuse" {
			b.WriteString("fi\n")
		}
	}
	return b.String()
}

// What the admin and the owner see, on real guests: a guest that cannot
// reach its server is reported and clears; the restore guide runs as
// written in the guest; a file of a deleted VM is restored in another VM of
// its namespace through the annotation.
var _ = Describe("Restore on their own, and a guest that does not connect", Ordered, func() {
	const (
		bslsNS = "backup"
		vmNS   = "team-a"
		// notConnectedAfter is the controller's delay here: shorter than
		// the guest blocks its way to the server (90 s of uptime, which
		// starts after its instance was created).
		notConnectedAfter = 20 * time.Second
	)
	var (
		ctx      context.Context
		platform *local.Platform
		blocks   []docBlock
	)
	vmEvents := func(name string) func() ([]string, error) { return eventsOfVM(ctx, platform, vmNS, name) }
	// newVM is an opted-in VM of vmNS with paths /srv/data and the owner's
	// inline cloud-config, and annotations besides.
	newVM := func(name, cloudConfig string, annotations map[string]string) *kubevirtv1.VirtualMachine {
		GinkgoHelper()
		vm := story.OwnersVM(vmNS, name, bslsNS+"/main", "/srv/data", cloudConfig)
		maps.Copy(vm.Annotations, annotations)
		return story.CreateStored(ctx, platform.API.Client, vm)
	}
	// run starts vm, waits while it runs for what during says, then for
	// its guest to power off, and returns its markers.
	run := func(vm *kubevirtv1.VirtualMachine, during func()) map[string]string {
		GinkgoHelper()
		inst, err := platform.StartVM(ctx, GinkgoT(), vm)
		Expect(err).NotTo(HaveOccurred())
		if during != nil {
			during()
		}
		res, err := inst.Wait(ctx)
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Printf("guest of VM %s: boot to power off %v (%v of qemu's CPU)\n", vm.Name, res.Elapsed.Round(time.Second), res.CPU.Round(time.Second))
		m := story.Markers(res.Console)
		m["logs"] = story.Logs(res.Console)
		return m
	}
	// blocksOK expects every block of the runner to have run.
	blocksOK := func(m map[string]string, tags ...string) {
		GinkgoHelper()
		n := 0
		for _, blk := range blocks {
			for _, t := range tags {
				if blk.tag != t {
					continue
				}
				n++
				key := fmt.Sprintf("block-%s-%d", blk.tag, n)
				want := "ok"
				if blk.tag == "guest-fuse" {
					want = "skipped: no fusermount3 in this image" // the test image has no FUSE
				}
				Expect(m).To(HaveKeyWithValue(key, want), "docs/guest.md block %d (%s) in the guest:\n%s\nthe guest said:\n%s", n, blk.tag, blk.code, m["logs"])
			}
		}
		Expect(n).To(BeNumerically(">", 0), "blocks tagged %v in docs/guest.md", tags)
	}

	BeforeAll(func() {
		ctx = context.Background()
		o := local.ControllerOptions()
		o.GuestNotConnectedAfter = notConnectedAfter
		bp := startBackupPlatformWith(ctx, local.Options{Logger: GinkgoLogr, Controller: &o, Requests: true}, bslsNS, vmNS)
		platform = bp.Platform
		blocks = guestDocBlocks()
		Expect(blocks).NotTo(BeEmpty())
	})

	// old's guest: what the spec after it restores from.
	var old map[string]string

	It("warns about a running VM whose guest cannot reach its server, clears once it does, and runs the restore guide as written", func() {
		// The owner's cloud-config: a blackhole route to the server's
		// address at every boot, removed at 90 s of uptime; then, once the
		// guest's first snapshot is taken, a change, and the guide.
		config := `#cloud-config
bootcmd:
- [ip, route, add, blackhole, 10.0.2.2/32]
write_files:
- path: /srv/data/report.txt
  content: "report v1\n"
- path: /srv/data/photos/1.jpg
  content: "photo one\n"
- path: /usr/local/sbin/guide
  permissions: '0755'
  encoding: b64
  content: ` + base64.StdEncoding.EncodeToString([]byte(docRunner(blocks, "guest", "guest-fuse"))) + `
- path: /usr/local/sbin/report
  permissions: '0755'
  content: |
    #!/bin/sh
    say() { echo "GB-E2E $*" >/dev/console; }
    while [ "$(cut -d. -f1 /proc/uptime)" -lt 90 ]; do sleep 2; done
    say "blocked $(journalctl --no-pager -u guestbackup-connect | grep -c 'failed')"
    ip route del blackhole 10.0.2.2/32
    i=0
    while [ $i -lt 400 ] && ! [ -e /var/lib/guestbackup/last-snapshot-attempt ]; do sleep 2; i=$((i+2)); done
    say "status $(cat /var/lib/guestbackup/status)"
    echo "report v2" >/srv/data/report.txt
    /usr/local/sbin/guide
    say "report $(cat /srv/data/report.txt)"
    say "restored $(cat /srv/data/report.txt.restored)"
    say "photos $(cat /var/tmp/photos/1.jpg)"
    journalctl --no-pager -u guestbackup-connect | tail -n 12 | sed 's/^/GB-E2E-LOG /' >/dev/console
    systemctl poweroff
runcmd:
- [systemd-run, --unit=report, --no-block, /usr/local/sbin/report]
`
		vm := newVM("old", config, nil)
		old = run(vm, func() {
			Eventually(vmEvents("old")).WithTimeout(2 * time.Minute).Should(ContainElement(And(
				HavePrefix("Warning GuestNotConnected: The guest has not connected to BackupStorageLocationServer backup/main as old@team-a within 20s"),
				ContainSubstring("cannot reach the server's URL"))))
			Expect(testbed.Metric(platform.MetricsAddr, "guestbackup_vm_guest_not_connected", map[string]string{"namespace": vmNS, "vm": "old", "bsls": bslsNS + "/main"})).To(Equal(1.0))
		})
		Expect(old["blocked"]).NotTo(Equal("0"), "the guest's connect attempts failed while blocked:\n%s", old["logs"])
		Expect(old["status"]).To(ContainSubstring("connected to https://10.0.2.2:"), old["logs"])

		By("clearing once its first snapshot reached the server")
		Eventually(vmEvents("old")).WithTimeout(time.Minute).Should(ContainElement(HavePrefix("Normal GuestConnected: Guest backs up as old@team-a")))
		Eventually(func() (float64, error) {
			return testbed.Metric(platform.MetricsAddr, "guestbackup_vm_guest_not_connected", map[string]string{"namespace": vmNS, "vm": "old", "bsls": bslsNS + "/main"})
		}).WithTimeout(time.Minute).Should(Equal(0.0))
		events, err := vmEvents("old")()
		Expect(err).NotTo(HaveOccurred())
		warnings := 0
		for _, e := range events {
			if strings.HasPrefix(e, "Warning GuestNotConnected") {
				warnings++
			}
		}
		Expect(warnings).To(Equal(1), "one warning for the instance: %v", events)

		By("every command of the guide having run in the guest, with the outcome it promises")
		blocksOK(old, "guest", "guest-fuse")
		Expect(old).To(HaveKeyWithValue("report", "report v1"), "restored in place from the oldest snapshot")
		Expect(old).To(HaveKeyWithValue("restored", "report v2"), "restored beside it from the latest")
		Expect(old).To(HaveKeyWithValue("photos", "photo one"), "a folder restored elsewhere")
	})

	It("restores the file of the deleted VM into another VM of the namespace through the annotation", func() {
		Expect(old).NotTo(BeNil(), "old's guest ran")
		gone := &kubevirtv1.VirtualMachine{}
		gone.Name, gone.Namespace = "old", vmNS
		Expect(platform.API.Client.Delete(ctx, gone)).To(Succeed())

		config := `#cloud-config
write_files:
- path: /srv/data/notes.txt
  content: "new VM\n"
- path: /usr/local/sbin/guide
  permissions: '0755'
  encoding: b64
  content: ` + base64.StdEncoding.EncodeToString([]byte(docRunner(blocks, "guest-restore-from"))) + `
- path: /usr/local/sbin/report
  permissions: '0755'
  content: |
    #!/bin/sh
    say() { echo "GB-E2E $*" >/dev/console; }
    i=0
    while [ $i -lt 400 ] && ! [ -e /var/lib/guestbackup/last-snapshot-attempt ]; do sleep 2; i=$((i+2)); done
    say "status $(cat /var/lib/guestbackup/status)"
    /usr/local/sbin/guide
    say "fromold $(cat /srv/data/report-from-old.txt)"
    i=0
    while [ $i -lt 300 ] && [ "$(journalctl --no-pager -u guestbackup-requests | grep -c 'answered request')" -lt 2 ]; do sleep 2; i=$((i+2)); done
    say "answered $(journalctl --no-pager -u guestbackup-requests | sed -n 's/.*guestbackup: answered request //p' | head -n 1)"
    say "answered-second $(journalctl --no-pager -u guestbackup-requests | sed -n 's/.*guestbackup: answered request //p' | sed -n 2p)"
    say "cluster-fromold $(cat /var/lib/guestbackup/restores/new-from-old/srv/data/report.txt)"
    say "in-place $(sha256sum </srv/data/report.txt | cut -d' ' -f1) $(stat -c %a:%U /srv/data/report.txt) $(cat /srv/data/notes.txt)"
    systemctl poweroff
runcmd:
- [systemd-run, --unit=report, --no-block, /usr/local/sbin/report]
`
		vm := newVM("new", config, map[string]string{"guestbackup.io/restore-from": "old"})
		Eventually(vmEvents("new")).WithTimeout(time.Minute).Should(ContainElement(
			HavePrefix("Normal RestoreAccessGranted: This VM's guest may read the snapshots of old@team-a")))

		By("listing from the cluster, with kubectl guestbackup restore --list, what restoring the deleted VM's folder would write, before the new VM runs")
		listing := exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "restore", "vm/new", "/srv/data", "--source-vm", "old", "--list", "--wait",
			"--timeout", "2m", "--name", "new-list-old", "-n", vmNS, "--kubeconfig", platform.API.Kubeconfig(GinkgoT()))
		listed, err := listing.Output()
		Expect(err).NotTo(HaveOccurred(), string(listed))
		Expect(string(listed)).To(ContainSubstring("guestrestore/new-list-old succeeded, a dry run: restoring would write"))
		Expect(string(listed)).To(MatchRegexp(`(?m)^file +[0-9.]+ B +\S+ +/var/lib/guestbackup/restores/new-list-old/srv/data/report.txt$`))
		Eventually(vmEvents("new")).WithTimeout(30 * time.Second).Should(ContainElement(
			HavePrefix("Normal RestoreListed: Restore requested by ")))

		By("asking from the cluster, with kubectl guestbackup, for the deleted VM's file in the new VM's guest")
		plugin := exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "restore", "vm/new", "/srv/data/report.txt", "--source-vm", "old",
			"--name", "new-from-old", "-n", vmNS, "--kubeconfig", platform.API.Kubeconfig(GinkgoT()))
		out, err := plugin.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		asked := &v1alpha1.GuestRestore{}
		Eventually(func() v1alpha1.RequestPhase {
			_ = platform.API.Client.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: "new-from-old"}, asked)
			return asked.Status.Phase
		}).WithTimeout(30*time.Second).Should(Equal(v1alpha1.PhasePending), "the restore, handed to the new VM's server")

		By("asking, after it, for the deleted VM's whole folder in place, over the new VM's own")
		// A guest carries out its requests oldest first, by creation time
		// (whole seconds): this one is made in a later second.
		Eventually(func() bool { return time.Now().After(asked.CreationTimestamp.Add(time.Second)) }).WithPolling(100 * time.Millisecond).Should(BeTrue())
		plugin = exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "restore", "vm/new", "/srv/data", "--source-vm", "old", "--in-place",
			"--name", "new-in-place", "-n", vmNS, "--kubeconfig", platform.API.Kubeconfig(GinkgoT()))
		out, err = plugin.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		inPlace := &v1alpha1.GuestRestore{}
		Eventually(func() v1alpha1.RequestPhase {
			_ = platform.API.Client.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: "new-in-place"}, inPlace)
			return inPlace.Status.Phase
		}).WithTimeout(30 * time.Second).Should(Equal(v1alpha1.PhasePending))

		m := run(vm, nil)
		Expect(m["status"]).To(ContainSubstring("connected to https://10.0.2.2:"), m["logs"])
		blocksOK(m, "guest-restore-from")
		Expect(m).To(HaveKeyWithValue("fromold", "report v2"), "the deleted VM's file, from its latest snapshot")

		By("restoring it, as asked from the cluster, into the request's folder in the new VM's guest, from the deleted VM's latest snapshot")
		Expect(m).To(HaveKeyWithValue("answered", string(asked.UID)+": Succeeded"), m["logs"])
		Expect(m).To(HaveKeyWithValue("cluster-fromold", "report v2"), m["logs"])
		Eventually(func() v1alpha1.RequestPhase {
			_ = platform.API.Client.Get(ctx, client.ObjectKeyFromObject(asked), asked)
			return asked.Status.Phase
		}).WithTimeout(30*time.Second).Should(Equal(v1alpha1.PhaseSucceeded), "%+v", asked.Status)
		Expect(asked.Status.Snapshots).To(ConsistOf(HaveField("Path", "/srv/data/report.txt")))
		Eventually(vmEvents("new")).WithTimeout(30 * time.Second).Should(ContainElement(HavePrefix(
			"Normal Restored: Restore requested by " + asked.Spec.Requester.Username + " (new-from-old) restored /srv/data/report.txt (" + asked.Status.Snapshots[0].ID +
				") from VirtualMachine old's snapshots into /var/lib/guestbackup/restores/new-from-old in the guest")))

		By("restoring the folder in place: the deleted VM's file at its own path, byte for byte, with its mode, and the new VM's own file left")
		Expect(m).To(HaveKeyWithValue("answered-second", string(inPlace.UID)+": Succeeded"), m["logs"])
		v2 := sha256.Sum256([]byte("report v2\n"))
		Expect(m).To(HaveKeyWithValue("in-place", hex.EncodeToString(v2[:])+" 644:root new VM"), m["logs"])
		Eventually(func() v1alpha1.RequestPhase {
			_ = platform.API.Client.Get(ctx, client.ObjectKeyFromObject(inPlace), inPlace)
			return inPlace.Status.Phase
		}).WithTimeout(30*time.Second).Should(Equal(v1alpha1.PhaseSucceeded), "%+v", inPlace.Status)
		Eventually(vmEvents("new")).WithTimeout(30 * time.Second).Should(ContainElement(HavePrefix(
			"Normal Restored: Restore requested by " + inPlace.Spec.Requester.Username + " (new-in-place) restored /srv/data (" + inPlace.Status.Snapshots[0].ID +
				") from VirtualMachine old's snapshots in place in the guest")))
	})
})
