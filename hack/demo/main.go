// Command demo runs the whole of guestbackup on this machine, on the real
// components of the test bed, and narrates it: a real API server, the
// controller and the webhook, a BackupStorageLocationServer's Kopia server
// run from the Deployment the controller writes, and a VirtualMachine whose
// guest boots under qemu, connects and snapshots with nothing but what the
// webhook injected. It ends with the guest's snapshot list and the VM's
// Events. Run it with `make demo`, which builds the tools first.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

const (
	bslsNamespace = "backup"
	vmNamespace   = "team-a"
	vmName        = "web"
	// readyTimeout bounds the wait for the BSLS to become Ready.
	readyTimeout = time.Minute
	// eventsTimeout bounds the wait for the Events that follow a snapshot
	// (the activity poll runs every 2 s here).
	eventsTimeout = 30 * time.Second
)

// ownerConfig is the VM owner's own cloud-config: a file worth backing up,
// and, standing in for someone who logs in, a unit that waits (bounded) for
// the first snapshot, prints the guest's snapshot list on the console and
// powers the guest off.
const ownerConfig = `#cloud-config
write_files:
- path: /srv/data/notes.txt
  content: "guestbackup demo: this file is backed up by the guest itself\n"
- path: /usr/local/sbin/demo-report
  permissions: '0755'
  content: |
    #!/bin/sh
    export HOME=/root KOPIA_CHECK_FOR_UPDATES=false
    i=0
    while [ $i -lt 300 ] && ! [ -e /var/lib/guestbackup/last-snapshot-attempt ]; do sleep 2; i=$((i+2)); done
    echo "DEMO the image's own kopia: $(command -v kopia || echo none)" >/dev/console
    journalctl --no-pager -o cat -u guestbackup-connect | grep -e 'fetching kopia' -e 'installed kopia' | sed 's/^/DEMO /' >/dev/console
    echo "DEMO status: $(cat /var/lib/guestbackup/status 2>/dev/null)" >/dev/console
    guestbackup-kopia snapshot list --all 2>&1 | sed 's/^/DEMO /' >/dev/console
    systemctl poweroff
runcmd:
- [systemd-run, --unit=demo-report, --no-block, /usr/local/sbin/demo-report]
`

var demoLine = regexp.MustCompile(`(?m)^DEMO (.*?)\r?$`)

func main() {
	// A flag set of the demo's own: KubeVirt's client library, which the
	// test bed links for VM consoles, defines its own -v on the global set
	// at init.
	flags := flag.NewFlagSet("demo", flag.ExitOnError)
	verbose := flags.Bool("v", false, "print the components' logs")
	guest := flags.Bool("guest", true, "boot the VM's guest; false stops once the server is Ready")
	image := flags.String("image", imageStock, "the guest's image: "+imageStock+" (a stock-like cloud image without kopia: the guest fetches it from its server) or "+imageKopia+" (the test image, which carries kopia)")
	onNode := flags.Bool("node", false, "install the chart with helm on the test bed's real node (kubelet, containerd): controller, webhook and server run as real pods")
	onCluster := flags.Bool("cluster", false, "also install KubeVirt on that node from its operator: KubeVirt's virt-handler and virt-launcher boot the VM's guest (make tools-cluster builds its images)")
	_ = flags.Parse(os.Args[1:]) // ExitOnError: never returns an error
	r := newRun(os.Stdout, *verbose)
	// Every process the test bed starts dies with this one (its parent
	// death signal); the cleanups also remove the demo's folders.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		fmt.Fprintln(r.out, "\ninterrupted: stopping everything")
		_ = r.close()
		os.Exit(130)
	}()
	set := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := checkFlags(set, *image, *onNode || *onCluster); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(2)
	}
	err := r.guard(func() error {
		if *onCluster {
			return demoCluster(context.Background(), r)
		}
		if *onNode {
			return demoNode(context.Background(), r)
		}
		return demo(context.Background(), r, *guest, *image == imageStock)
	})
	if cerr := r.close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("stopping: %w", cerr))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

// checkFlags refuses what the demo would otherwise ignore: an unknown
// -image, and -image or -guest (set names the flags given) with -node or
// -cluster, whose demos run their own guest (or none).
func checkFlags(set map[string]bool, image string, onNode bool) error {
	if image != imageStock && image != imageKopia {
		return fmt.Errorf("-image=%s: want %s or %s", image, imageStock, imageKopia)
	}
	if onNode {
		for _, name := range []string{"image", "guest"} {
			if set[name] {
				return fmt.Errorf("-%s applies to the local demo only: -node stops once the server is Ready, and -cluster boots the test guest's containerDisk", name)
			}
		}
	}
	return nil
}

// The guest images -image chooses from.
const (
	imageStock = "stock"
	imageKopia = "kopia"
)

// demo narrates the product on r's output; without bootGuest, or when no
// guest can boot here, it stops once the server is Ready. stock boots the
// stock-like image, which has no kopia; else the test image, which has.
func demo(ctx context.Context, r *run, bootGuest, stock bool) error {
	start := time.Now()
	logger := r.logger()

	r.step("Starting a real API server (kube-apiserver and etcd on loopback) with the BSLS, KubeVirt and cert-manager CRDs, " +
		"KubeVirt's control plane (virt-api, virt-controller), and guestbackup's controller and webhook in this process")
	p := local.Start(r, local.Options{Logger: logger, StockGuests: stock})
	c := p.API.Client
	for _, ns := range []string{bslsNamespace, vmNamespace} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"guestbackup.io/allowed": "true"}}}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	r.done()

	port, err := testbed.FreePorts(2) // the server's port and its client port, the next
	if err != nil {
		return err
	}
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: bslsNamespace},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
			Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"guestbackup.io/allowed": "true"}}},
			// The guest reaches the host's loopback as 10.0.2.2 (qemu's user
			// network), as a VM on a secondary network reaches a node port.
			ClientURL: fmt.Sprintf("https://%s:%d", testbed.GuestHostAddress, port),
		},
	}
	r.step("Admin: creating BackupStorageLocationServer %s/%s (filesystem storage, for namespaces labelled guestbackup.io/allowed=true, clientURL %s)",
		bslsNamespace, bsls.Name, bsls.Spec.ClientURL)
	if err := c.Create(ctx, bsls); err != nil {
		return fmt.Errorf("create the BSLS: %w", err)
	}
	r.say("the controller wrote its Secrets, Service and Deployment; running the Deployment's pod here (init: create the repository; then the Kopia server)")
	if _, err := p.ServeBSLS(ctx, r, bsls, port); err != nil {
		return err
	}
	err = testbed.WaitFor(readyTimeout, 200*time.Millisecond, func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(bsls), bsls); err != nil {
			return false, nil
		}
		return meta.IsStatusConditionTrue(bsls.Status.Conditions, v1alpha1.ConditionReady), nil
	})
	if err != nil {
		return fmt.Errorf("BSLS did not become Ready: %w; its conditions: %v", err, bsls.Status.Conditions)
	}
	r.say("Ready: endpoint %s, TLS fingerprint %s", bsls.Status.Endpoint, bsls.Status.TLSFingerprint)
	_ = testbed.WaitFor(eventsTimeout, time.Second, func() (bool, error) {
		return c.Get(ctx, client.ObjectKeyFromObject(bsls), bsls) == nil && bsls.Status.Client != nil, nil
	})
	if cl := bsls.Status.Client; cl != nil {
		r.say("it hands guests kopia %s at %s (SHA-256 amd64 %s, arm64 %s)", cl.Version, cl.URL, cl.SHA256["amd64"], cl.SHA256["arm64"])
	}
	r.done()

	if !bootGuest {
		r.say("no guest was asked for (-guest=false): the demo stops here, with the server ready")
		return nil
	}
	if why := guestUnavailable(stock); why != "" {
		r.say("%s: the demo stops here, with the server ready. `make tools` installs qemu and builds the guest image.", why)
		return nil
	}

	r.step("Owner: creating VirtualMachine %s/%s with annotations %s=%s/%s and %s=/srv/data, and their own cloud-config",
		vmNamespace, vmName, v1alpha1.AnnotationServer, bslsNamespace, bsls.Name, v1alpha1.AnnotationPaths)
	vm := ownersVM(bsls)
	if err := c.Create(ctx, vm); err != nil {
		return fmt.Errorf("create the VirtualMachine: %w", err)
	}
	stored := &kubevirtv1.VirtualMachine{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(vm), stored); err != nil {
		return err
	}
	for _, v := range stored.Spec.Template.Spec.Volumes {
		if v.CloudInitNoCloud != nil && v.CloudInitNoCloud.UserDataSecretRef != nil {
			r.say("the webhook moved the cloud-config, with guestbackup's bootstrap merged in, to Secret %s (volume %s); the VM spec holds no password",
				v.CloudInitNoCloud.UserDataSecretRef.Name, v.Name)
		}
	}
	admitted, err := kubevirtLogged(func() (testbed.KubeVirtLogEntry, bool, error) { return p.KubeVirt.Admission(vmNamespace, vmName) })
	if err != nil {
		return fmt.Errorf("virt-api's admission of the VM: %w", err)
	}
	r.say("virt-api, KubeVirt's own admission webhook, admitted it in the same chain; virt-api's log: %s", admitted)
	r.say("its defaults are in the stored VM: firmware UUID %s, machine %s", local.InstanceID(stored), machineType(stored))
	r.done()

	r.step("KubeVirt's part: virt-controller makes the VM's instance and launcher pod (runStrategy Always) and schedules the instance once the pod runs; the node's part (scheduler, kubelet, virt-handler) is played by the test bed, and KubeVirt's own pkg/cloud-init builds the guest's seed from the Secret as virt-launcher would, booted under qemu (software emulation: a minute or two)")
	instance, err := p.StartVM(ctx, r, stored)
	if err != nil {
		return err
	}
	started, err := kubevirtLogged(func() (testbed.KubeVirtLogEntry, bool, error) {
		return p.KubeVirt.Start(instance.VMI.Namespace, instance.VMI.Name)
	})
	if err != nil {
		return fmt.Errorf("virt-controller's start of the VM: %w", err)
	}
	r.say("virt-controller's log: %s", started)
	r.say("so VirtualMachineInstance %s/%s (UID %s) and launcher pod %s exist; the test bed, playing the node, bound the pod to %s and ran it, and virt-controller moved the instance to %s; its guest boots with instance-id %s, the firmware UUID",
		instance.VMI.Namespace, instance.VMI.Name, instance.VMI.UID, instance.Pod.Name, instance.VMI.Status.NodeName,
		scheduledPhase(instance.VMI), local.InstanceID(stored))
	res, err := instance.Wait(ctx)
	if err != nil {
		return err
	}
	r.say("the guest booted, connected, took its first snapshot and powered off after %v (%v of qemu's CPU); the VM is stopped (runStrategy Halted) and virt-controller deleted its instance",
		res.Elapsed.Round(time.Second), res.CPU.Round(time.Second))
	r.done()

	r.step("The guest's own words, from its console: where its kopia came from, its status and its snapshot list (guestbackup-kopia snapshot list --all, inside the guest)")
	var said []string
	for _, m := range demoLine.FindAllStringSubmatch(res.Console, -1) {
		said = append(said, m[1])
	}
	story, err := clientStory(said, bsls.Status.Client)
	if err != nil {
		return fmt.Errorf("%w; the guest said:\n%s", err, strings.Join(said, "\n"))
	}
	for _, line := range story {
		r.say("%s", line)
	}
	for _, line := range said {
		// What clientStory told already is the guest's connect log and
		// the image's own kopia.
		if !strings.HasPrefix(line, "guestbackup: ") && !strings.HasPrefix(line, ownKopia) {
			r.say("guest: %s", line)
		}
	}
	r.done()

	if err := sayEvents(ctx, r, c); err != nil {
		return err
	}
	fmt.Fprintf(r.out, "\nThe whole demo took %v; stopping everything.\n", time.Since(start).Round(time.Second))
	return nil
}

// sayEvents narrates the VM's Events, once the first snapshot's is among
// them or eventsTimeout passed.
func sayEvents(ctx context.Context, r *run, c client.Client) error {
	r.step("The VM's Events (what `kubectl describe vm %s -n %s` shows an admin)", vmName, vmNamespace)
	var events []string
	var err error
	_ = testbed.WaitFor(eventsTimeout, time.Second, func() (bool, error) {
		events, err = local.EventsOf(ctx, c, vmNamespace, "VirtualMachine", vmName)
		return err == nil && hasReason(events, "SnapshotCreated"), nil
	})
	if err != nil {
		return err
	}
	for _, e := range events {
		r.say("%s", e)
	}
	r.done()
	return nil
}

// guestUnavailable says why no guest can boot here, or "" when one can.
func guestUnavailable(stock bool) string {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "qemu-system-x86_64 is not installed"
	}
	load := testbed.LoadGuestImage
	if stock {
		load = testbed.LoadStockGuestImage
	}
	if _, err := load(); err != nil {
		return fmt.Sprintf("the guest image is not built (%v)", err)
	}
	return ""
}

// ownKopia begins the demo report's line about the image's own kopia
// (ownerConfig).
const ownKopia = "the image's own kopia: "

// What the guest's connect script logs (pkg/cloudinit's connectScript)
// about its kopia client, as the demo's report copies it to the console.
var (
	fetchedLine   = regexp.MustCompile(`^guestbackup: fetching kopia (\S*) ?for (\S+) from (\S+)$`)
	installedLine = regexp.MustCompile(`^guestbackup: installed kopia (\S*) ?\(([0-9a-f]{64})\) from (.+) in (\S+)$`)
)

// clientStory tells, from the guest's own console lines (said), where its
// kopia came from and whether its SHA-256 is the one the server published
// (published, the BSLS's status.client): the demo claims nothing the
// guest did not report. It fails when the guest reported no client, or
// one the server did not publish.
func clientStory(said []string, published *v1alpha1.ClientStatus) ([]string, error) {
	if published == nil {
		return nil, errors.New("the server published no kopia client (status.client)")
	}
	var story []string
	fetched := false
	for _, line := range said {
		if own, ok := strings.CutPrefix(line, ownKopia); ok {
			if own == "none" {
				story = append(story, "the image has no kopia of its own")
			} else {
				story = append(story, "the image has a kopia of its own, "+own)
			}
		}
		if m := fetchedLine.FindStringSubmatch(line); m != nil {
			fetched = true
			story = append(story, fmt.Sprintf("the guest downloaded kopia %s for %s from its server, %s, trusting the BSLS's CA and no other", m[1], m[2], m[3]))
		}
		if m := installedLine.FindStringSubmatch(line); m != nil {
			arch := archOf(m[3])
			want := published.SHA256[arch]
			if m[2] != want {
				return nil, fmt.Errorf("the guest installed kopia with SHA-256 %s, but the server published %q for %s", m[2], want, arch)
			}
			story = append(story, fmt.Sprintf("it verified the SHA-256 its bootstrap carries before running it: %s, the server's status.client.sha256.%s; installed in %s", m[2], arch, m[4]))
			if !fetched {
				story = append(story, "(from "+m[3]+": the same build as the server's, so nothing was downloaded)")
			}
			return story, nil
		}
	}
	return nil, errors.New("the guest reported no kopia client installed")
}

// archOf is the architecture of a client URL (.../kopia/linux-<arch>), or
// amd64, the guests' here, for a client the guest already had.
func archOf(from string) string {
	if _, arch, ok := strings.Cut(from, "/kopia/linux-"); ok {
		return arch
	}
	return "amd64"
}

// hasReason reports whether one of events, as local.Platform.Events
// writes them, has reason.
func hasReason(events []string, reason string) bool {
	for _, e := range events {
		if _, rest, _ := strings.Cut(e, " "); strings.HasPrefix(rest, reason+":") {
			return true
		}
	}
	return false
}

// ownersVM is a VM as its owner writes it: a containerDisk, their own
// inline cloud-config, and the opt-in annotations.
func ownersVM(bsls *v1alpha1.BackupStorageLocationServer) *kubevirtv1.VirtualMachine {
	virtio := kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{
			Name: vmName, Namespace: vmNamespace,
			Annotations: map[string]string{
				v1alpha1.AnnotationServer: bsls.Namespace + "/" + bsls.Name,
				v1alpha1.AnnotationPaths:  "/srv/data",
			},
		},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kubevirt.io/vm": vmName}},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
						Devices: kubevirtv1.Devices{Disks: []kubevirtv1.Disk{
							{Name: "root", DiskDevice: virtio},
							{Name: "cloudinit", DiskDevice: virtio},
						}},
					},
					Volumes: []kubevirtv1.Volume{
						{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/debian:12"}}},
						{Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: ownerConfig}}},
					},
				},
			},
		},
	}
}

// run is the demo's testbed.TB: Fatalf ends the demo (through guard),
// cleanups run in reverse when it ends, and the numbered steps it narrates
// are timed.
type run struct {
	out       io.Writer
	verbose   bool
	mu        sync.Mutex
	cleanups  []func()
	failed    bool
	dirs      []string
	steps     int
	stepStart time.Time
	closeOnce sync.Once
}

// fatal is what Fatalf panics with; guard turns it back into an error.
type fatal struct{ msg string }

func newRun(out io.Writer, verbose bool) *run { return &run{out: out, verbose: verbose} }

func (r *run) Helper() {}

func (r *run) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *run) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *run) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	panic(fatal{msg: fmt.Sprintf(format, args...)})
}

func (r *run) Logf(format string, args ...any) {
	// The test bed logs what it keeps after a failure (a guest's console,
	// a process's log): always worth showing.
	if r.verbose || r.Failed() {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

func (r *run) TempDir() string {
	dir, err := os.MkdirTemp("", "guestbackup-demo-")
	if err != nil {
		r.Fatalf("temporary folder: %v", err)
	}
	r.mu.Lock()
	r.dirs = append(r.dirs, dir)
	r.mu.Unlock()
	return dir
}

// guard runs f, turning a Fatalf into its error.
func (r *run) guard(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			f, ok := v.(fatal)
			if !ok {
				panic(v)
			}
			err = errors.New(f.msg)
		}
	}()
	err = f()
	if err != nil {
		r.mu.Lock()
		r.failed = true
		r.mu.Unlock()
	}
	return err
}

// close runs the cleanups, newest first, then removes the folders. A
// cleanup's Fatalf (a check the test bed makes at the end, such as
// KubeVirt's witness) is printed, fails the demo, and the other cleanups
// still run.
func (r *run) close() error {
	var failures []string
	r.closeOnce.Do(func() {
		r.mu.Lock()
		cleanups := r.cleanups
		r.mu.Unlock()
		for i := len(cleanups) - 1; i >= 0; i-- {
			if err := r.guard(func() error { cleanups[i](); return nil }); err != nil {
				failures = append(failures, err.Error())
			}
		}
		for _, d := range r.dirs {
			_ = os.RemoveAll(d)
		}
	})
	if len(failures) > 0 {
		return errors.New(strings.Join(failures, "\n"))
	}
	return nil
}

// logger is the components' logger, discarded unless -v; it is
// controller-runtime's global logger too (envtest and the informers log
// through it).
func (r *run) logger() logr.Logger {
	logger := logr.Discard()
	if r.verbose {
		logger = zap.New(zap.WriteTo(os.Stderr))
	}
	ctrl.SetLogger(logger)
	return logger
}

func (r *run) step(format string, args ...any) {
	r.steps++
	r.stepStart = time.Now()
	fmt.Fprintf(r.out, "\n==> %d. %s\n", r.steps, fmt.Sprintf(format, args...))
}

func (r *run) say(format string, args ...any) {
	fmt.Fprintf(r.out, "    %s\n", fmt.Sprintf(format, args...))
}

func (r *run) done() {
	fmt.Fprintf(r.out, "    (%v)\n", time.Since(r.stepStart).Round(100*time.Millisecond))
}

// kubevirtLogged waits (bounded) for a line of KubeVirt's log that entry
// finds: KubeVirt writes it a moment after the API server answered.
func kubevirtLogged(entry func() (testbed.KubeVirtLogEntry, bool, error)) (testbed.KubeVirtLogEntry, error) {
	var e testbed.KubeVirtLogEntry
	err := testbed.WaitFor(eventsTimeout, 100*time.Millisecond, func() (bool, error) {
		found, ok, err := entry()
		e = found
		return ok, err
	})
	return e, err
}

// scheduledPhase is the phase virt-controller set on vmi before the node
// reported it Running: Scheduled, from the instance's own record of its
// phases.
func scheduledPhase(vmi *kubevirtv1.VirtualMachineInstance) string {
	for _, t := range vmi.Status.PhaseTransitionTimestamps {
		if t.Phase == kubevirtv1.Scheduled {
			return fmt.Sprintf("%s at %s", t.Phase, t.PhaseTransitionTimestamp.Format(time.TimeOnly))
		}
	}
	return "(never Scheduled)"
}

// machineType is the machine type of vm's template, as virt-api's mutator
// defaulted it.
func machineType(vm *kubevirtv1.VirtualMachine) string {
	if m := vm.Spec.Template.Spec.Domain.Machine; m != nil {
		return m.Type
	}
	return "(none)"
}
