package kubevirt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
	"github.com/guestbackup/guestbackup/test/story"
)

// lifeConfig is the VM owner's own cloud-config, from the VM's first boot:
// two folders of files, a marker, and a report that runs at every boot (a
// per-boot script: the owner's runcmd runs at the first boot only). The
// report waits, bounded, for this boot's first snapshot when guestbackup is
// configured, prints what the guest has, and powers the guest off.
const lifeConfig = `#cloud-config
write_files:
- path: /srv/data/hello.txt
  content: "hello from the guest\n"
- path: /srv/more/second.txt
  content: "a second folder\n"
- path: /var/tmp/owner-marker
  content: "the owner's own cloud-config ran\n"
- path: /var/lib/cloud/scripts/per-boot/report
  permissions: '0755'
  content: |
    #!/bin/sh
    systemd-run --unit=report --no-block /usr/local/sbin/report
- path: /usr/local/sbin/report
  permissions: '0755'
  content: |
    #!/bin/sh
    export HOME=/root KOPIA_CHECK_FOR_UPDATES=false
    say() { echo "GB-E2E $*" >/dev/console; }
    boot=$(( $(date +%s) - $(cut -d. -f1 /proc/uptime) ))
    attempt() { stat -c %Y /var/lib/guestbackup/last-snapshot-attempt 2>/dev/null || echo 0; }
    if [ -e /etc/guestbackup/guestbackup.conf ]; then
      i=0
      while [ $i -lt 420 ] && [ "$(attempt)" -lt "$boot" ]; do sleep 2; i=$((i+2)); done
      say "snapshot-at $(( $(attempt) - boot ))"
      . /etc/guestbackup/guestbackup.conf
    fi
    say "marker $(cat /var/tmp/owner-marker)"
    say "configured $(ls /etc/guestbackup 2>/dev/null | tr '\n' ' ')"
    say "generation ${GUESTBACKUP_GENERATION:-none}"
    say "status $(cat /var/lib/guestbackup/status 2>/dev/null)"
    say "timer $(systemctl is-enabled guestbackup-snapshot.timer 2>&1 | head -n 1)"
    say "kopia $([ -e /root/.config/kopia/repository.config ] && echo connected || echo disconnected)"
    say "userdata $(sha256sum </var/lib/cloud/instance/user-data.txt | cut -d' ' -f1)"
    journalctl -b --no-pager -u guestbackup-connect -u guestbackup-snapshot | tail -n 15 | sed 's/^/GB-E2E-LOG /' >/dev/console
    systemctl poweroff
`

var _ = Describe("A VM's life: every boot and every change reach its guest", Ordered, func() {
	const (
		bslsNS = "backup"
		vmNS   = "team-a"
		vmName = "life"
		user   = vmName + "@" + vmNS
	)
	var (
		ctx       context.Context
		platform  *local.Platform
		api       *testbed.APIServer
		bsls      *v1alpha1.BackupStorageLocationServer
		localPort int
		// passwords by credentials generation, as the Secret held them.
		passwords = map[string]string{}
		// snapshots of the guest's paths, as the repository's owner sees
		// them after each boot.
		seen map[string]int
	)
	key := types.NamespacedName{Namespace: vmNS, Name: vmName}

	vmEvents := func() ([]string, error) { return platform.Events(ctx, vmNS, "VirtualMachine", vmName) }
	getVM := func() *kubevirtv1.VirtualMachine {
		GinkgoHelper()
		vm := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, key, vm)).To(Succeed())
		return vm
	}
	// annotate changes the VM's annotations as its owner would (kubectl
	// annotate): nil values remove.
	annotate := func(changes map[string]*string) {
		GinkgoHelper()
		vm := getVM()
		patch := client.MergeFrom(vm.DeepCopy())
		if vm.Annotations == nil {
			vm.Annotations = map[string]string{}
		}
		for k, v := range changes {
			if v == nil {
				delete(vm.Annotations, k)
			} else {
				vm.Annotations[k] = *v
			}
		}
		Expect(api.Client.Patch(ctx, vm, patch)).To(Succeed())
	}
	secret := func() (*corev1.Secret, error) {
		s := &corev1.Secret{}
		err := api.Client.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: vmsecret.Name(vmName)}, s)
		return s, err
	}
	// hashedGeneration waits until the Secret's current generation is
	// hashed, and returns it with its password.
	hashedGeneration := func() (generation, password string) {
		GinkgoHelper()
		Eventually(func() (string, error) {
			s, err := secret()
			if err != nil {
				return "", err
			}
			if _, ok := vmsecret.PasswordHash(s); !ok {
				return "", nil
			}
			generation, password = vmsecret.Generation(s), vmsecret.Password(s)
			return generation, nil
		}).WithTimeout(time.Minute).ShouldNot(BeEmpty())
		passwords[generation] = password
		return generation, password
	}
	serverURL := func() string { return fmt.Sprintf("https://127.0.0.1:%d", localPort) }
	// login is the server's answer to user with password: "" when it lets
	// the user in.
	login := func(password string) string {
		out, err := testbed.NewKopiaClient(GinkgoT()).ConnectPinned(ctx, serverURL(), bsls.Status.TLSFingerprint, user, password)
		if err != nil {
			return "refused: " + out
		}
		return ""
	}
	// snapshotCounts counts the VM's snapshots by path, as the
	// repository's owner sees them: they stay when the user goes.
	snapshotCounts := func() map[string]int {
		GinkgoHelper()
		repo, err := platform.Repository(ctx, GinkgoT(), bsls)
		Expect(err).NotTo(HaveOccurred())
		out, err := repo.Run(ctx, "snapshot", "list", "--all", "--json")
		Expect(err).NotTo(HaveOccurred(), out)
		var list []struct {
			Source struct {
				Host     string `json:"host"`
				UserName string `json:"userName"`
				Path     string `json:"path"`
			} `json:"source"`
		}
		Expect(json.Unmarshal([]byte(out), &list)).To(Succeed(), out)
		counts := map[string]int{}
		for _, s := range list {
			if s.Source.UserName+"@"+s.Source.Host == user {
				counts[s.Source.Path]++
			}
		}
		return counts
	}
	// boot starts the VM's guest and waits until it powers off; pending
	// lets the test act while the instance's launcher pod is Pending (before
	// the node reads the VM's Secrets), during while the guest runs.
	boot := func(pending, during func()) map[string]string {
		GinkgoHelper()
		var opts []local.StartOption
		if pending != nil {
			opts = append(opts, local.WhileLauncherPending(func(*kubevirtv1.VirtualMachineInstance, *corev1.Pod) { pending() }))
		}
		instance, err := platform.StartVM(ctx, GinkgoT(), getVM(), opts...)
		Expect(err).NotTo(HaveOccurred())
		if during != nil {
			during()
		}
		res, err := instance.Wait(ctx)
		Expect(err).NotTo(HaveOccurred(), "console %s:\n%s", instance.Guest.ConsoleLog, res.Console)
		m := story.Markers(res.Console)
		GinkgoWriter.Printf("boot of VM %s: power on to off %v (%v of qemu's CPU); markers %q\nguest services:\n%s\n", vmName, res.Elapsed.Round(time.Second), res.CPU.Round(time.Second), m, story.Logs(res.Console))
		return m
	}
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return hex.EncodeToString(h[:])
	}

	BeforeAll(func() {
		ctx = context.Background()
		bp := startBackupPlatform(ctx, bslsNS, vmNS)
		platform, api, bsls, localPort = bp.Platform, bp.API, bp.bsls, bp.port
		Eventually(func() bool {
			_ = api.Client.Get(ctx, client.ObjectKeyFromObject(bsls), bsls)
			return meta.IsStatusConditionTrue(bsls.Status.Conditions, v1alpha1.ConditionReady)
		}).WithTimeout(time.Minute).Should(BeTrue())
	})

	It("boots a VM without guestbackup: only its own cloud-config runs", func() {
		vm := story.TypicalVM(vmName)
		vm.Namespace, vm.Annotations = vmNS, nil
		vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud = &kubevirtv1.CloudInitNoCloudSource{UserData: lifeConfig}
		Expect(api.Client.Create(ctx, vm)).To(Succeed())

		m := boot(nil, nil)
		Expect(m).To(HaveKeyWithValue("marker", "the owner's own cloud-config ran"))
		Expect(m).To(HaveKeyWithValue("configured", ""), "no guestbackup in a guest that did not opt in")
		Expect(m).To(HaveKeyWithValue("userdata", sum(lifeConfig)))
	})

	It("opts in the VM that already booted: at its next boot the guest connects and snapshots, and a rotation meanwhile locks it out of nothing", func() {
		annotate(map[string]*string{v1alpha1.AnnotationServer: ptrTo(bslsNS + "/main"), v1alpha1.AnnotationPaths: ptrTo("/srv/data")})
		first, _ := hashedGeneration()
		Eventually(vmEvents).WithTimeout(time.Minute).Should(
			ContainElement(HavePrefix("Normal UserProvisioned: User " + user + " provisioned")))

		m := boot(nil, func() {
			By("rotating the password and changing the paths while the guest boots with the first credentials")
			vmi := &kubevirtv1.VirtualMachineInstance{}
			Expect(api.Client.Get(ctx, key, vmi)).To(Succeed())
			started, ok := credentials.LauncherStarted(vmi)
			Expect(ok).To(BeTrue(), "the launcher pod runs")
			// Phase transition times have a resolution of a second: rotate
			// in a later one, so that the rotation is after the launcher's
			// start at that resolution too.
			testbed.SleepPastSecondOf(started)
			annotate(map[string]*string{v1alpha1.AnnotationRotate: ptrTo("1"), v1alpha1.AnnotationPaths: ptrTo("/srv/data,/srv/more")})
			second, _ := hashedGeneration()
			Expect(second).NotTo(Equal(first))
			Consistently(func() string { return login(passwords[first]) }).WithTimeout(5*time.Second).WithPolling(time.Second).Should(BeEmpty(),
				"the running guest's password is valid until it restarts with the new one")
			Eventually(vmEvents).WithTimeout(30 * time.Second).Should(
				ContainElement(HavePrefix("Normal RotationPending: Credentials generation " + second + " is ready")))
		})
		Expect(m["status"]).To(ContainSubstring("connected to https://10.0.2.2:"+strconv.Itoa(localPort)+" as "+user+" (credentials generation "+first+")"), "markers %q", m)
		Expect(m).To(HaveKeyWithValue("marker", "the owner's own cloud-config ran"))
		Expect(m).To(HaveKeyWithValue("timer", "enabled"))
		AddReportEntry("boot to first snapshot, VM's second boot (first with guestbackup)", m["snapshot-at"]+" s")
		seen = snapshotCounts()
		Expect(seen).To(HaveKeyWithValue("/srv/data", 1))
	})

	// KubeVirt reads the Secret when the launcher pod starts, not when the
	// instance is created: a rotation while the pod is Pending reaches this
	// very boot, and the server must take the new password at once (the
	// guest would otherwise be refused for the grace period).
	It("gives the guest the rotated password and the new paths at its next boot, rotated again while its launcher pod was Pending: the newest password works, the older ones are refused, no snapshot is missed", func() {
		second, _ := hashedGeneration()
		var third string
		m := boot(func() {
			By("rotating again while the instance exists but its launcher pod is Pending, in a later second than the instance's creation")
			vmi := &kubevirtv1.VirtualMachineInstance{}
			Expect(api.Client.Get(ctx, key, vmi)).To(Succeed())
			testbed.SleepPastSecondOf(vmi.CreationTimestamp.Time)
			annotate(map[string]*string{v1alpha1.AnnotationRotate: ptrTo("2")})
			Eventually(func() (string, error) {
				s, err := secret()
				return vmsecret.Generation(s), err
			}).WithTimeout(time.Minute).ShouldNot(Equal(second))
			third, _ = hashedGeneration()
			Eventually(func() string { return login(passwords[third]) }).WithTimeout(time.Minute).WithPolling(2*time.Second).Should(BeEmpty(),
				"the server takes the password the launcher will read, at once")
		}, nil)
		Expect(m).To(HaveKeyWithValue("generation", third))
		Expect(m["status"]).To(ContainSubstring("as " + user + " (credentials generation " + third + ")"))
		AddReportEntry("boot to first snapshot, VM's third boot (rotated credentials, new paths)", m["snapshot-at"]+" s")

		Expect(login(passwords[third])).To(BeEmpty(), "the newest password")
		for generation, password := range passwords {
			if generation != third {
				Expect(login(password)).To(HavePrefix("refused"), "generation %s's password, rotated out", generation)
			}
		}
		Eventually(vmEvents).WithTimeout(30 * time.Second).Should(
			ContainElement(ContainSubstring("credentials rotated from generation " + second + " to " + third)))
		Expect(vmEvents()).NotTo(ContainElement(HavePrefix("Normal RotationPending: Credentials generation "+third)), "nothing kept for a guest that never had generation "+second)

		now := snapshotCounts()
		Expect(now["/srv/data"]).To(Equal(seen["/srv/data"]+1), "a snapshot of the old path at this boot too")
		Expect(now).To(HaveKeyWithValue("/srv/more", 1), "the new path is snapshotted")
		seen = now
	})

	It("opts out: at the next boot the guest stops backing up, its snapshots stay, and its own cloud-init is as it was", func() {
		annotate(map[string]*string{v1alpha1.AnnotationServer: nil, v1alpha1.AnnotationPaths: nil})
		vm := getVM()
		Expect(vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud).To(Equal(&kubevirtv1.CloudInitNoCloudSource{UserData: lifeConfig}), "the owner's inline cloud-config, byte for byte")
		Eventually(func() bool { _, err := secret(); return err != nil }).WithTimeout(time.Minute).Should(BeTrue(), "the credential Secret is deleted")

		m := boot(nil, nil)
		Expect(m).To(HaveKeyWithValue("userdata", sum(lifeConfig)), "cloud-init ran the owner's own user-data, as it was")
		Expect(m).To(HaveKeyWithValue("marker", "the owner's own cloud-config ran"))
		Expect(m).To(HaveKeyWithValue("configured", ""), "no credentials left in the guest")
		Expect(m).To(HaveKeyWithValue("kopia", "disconnected"))
		Expect(m["timer"]).NotTo(Equal("enabled"))
		Expect(m["status"]).To(ContainSubstring("opted out"))
		Expect(snapshotCounts()).To(Equal(seen), "no new snapshot, and every old one kept")
	})
})

func ptrTo(s string) *string { return &s }
