package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	kvcorev1 "kubevirt.io/client-go/kubevirt/typed/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ClusterGuestKernelArgs boot the test guest's kernel (a kernelBoot
// container) on its root disk, the first, with the console on the first
// serial port, which KubeVirt attaches to every VM.
const ClusterGuestKernelArgs = "root=/dev/vda rw console=ttyS0"

// ClusterGuest makes vm's first volume the test guest on a cluster with
// KubeVirtImages: its containerDisk, and a kernelBoot container from the
// same image (the guest's root file system has no boot loader). Both are
// imported, never pulled.
func ClusterGuest(vm *kubevirtv1.VirtualMachine, images KubeVirtImages) {
	spec := &vm.Spec.Template.Spec
	spec.Volumes[0].VolumeSource = kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{
		Image: images.Guest, Path: "/disk/disk.qcow2", ImagePullPolicy: corev1.PullNever,
	}}
	if spec.Domain.Firmware == nil {
		spec.Domain.Firmware = &kubevirtv1.Firmware{}
	}
	spec.Domain.Firmware.KernelBoot = &kubevirtv1.KernelBoot{
		KernelArgs: ClusterGuestKernelArgs,
		Container: &kubevirtv1.KernelBootContainer{
			Image: images.Guest, KernelPath: "/boot/vmlinuz", InitrdPath: "/boot/initrd.img", ImagePullPolicy: corev1.PullNever,
		},
	}
}

// ClusterBoot is what BootVM saw of one boot.
type ClusterBoot struct {
	GuestResult
	// Processes are KubeVirt's node processes (virt-handler, virt-launcher,
	// libvirtd, QEMU) seen on the machine while the guest ran.
	Processes []MachineProcess
}

// BootVM starts VirtualMachine key on node n with client c the way its
// owner does (its runStrategy becomes Once: the guest's power-off ends it),
// and reads the guest's serial console through KubeVirt's own path (the API server, the
// aggregated virt-api, virt-handler, the launcher's console socket) until
// the guest powers itself off, within timeout. It fails with what `kubectl
// describe` would say when the instance does not reach Running.
func BootVM(ctx context.Context, c client.Client, n *Node, key types.NamespacedName, timeout time.Duration) (ClusterBoot, error) {
	vm := &kubevirtv1.VirtualMachine{}
	if err := c.Get(ctx, key, vm); err != nil {
		return ClusterBoot{}, err
	}
	patch := client.MergeFrom(vm.DeepCopy())
	vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyOnce)
	if err := c.Patch(ctx, vm, patch); err != nil {
		return ClusterBoot{}, fmt.Errorf("start VirtualMachine %s: %w", key, err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := WaitFor(10*time.Minute, time.Second, func() (bool, error) {
		if err := c.Get(ctx, key, vmi); err != nil {
			return false, err
		}
		switch vmi.Status.Phase {
		case kubevirtv1.Running:
			return true, nil
		case kubevirtv1.Failed, kubevirtv1.Succeeded:
			return false, Permanent(fmt.Errorf("instance %s ended %s before it ran", key, vmi.Status.Phase))
		}
		return false, fmt.Errorf("instance %s is %s", key, vmi.Status.Phase)
	}); err != nil {
		return ClusterBoot{}, fmt.Errorf("%w\n%s", err, describeInstance(ctx, c, key))
	}
	start := time.Now()

	bootCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var boot ClusterBoot
	var watched sync.WaitGroup
	watched.Go(func() { boot.Processes = watchKubeVirtProcesses(bootCtx, n) })
	var console bytes.Buffer
	err := SerialConsole(bootCtx, n.API.Config, key, &console)
	// The console ends by itself when the domain stops; only the timeout
	// ends it early.
	timedOut := errors.Is(bootCtx.Err(), context.DeadlineExceeded)
	cancel()
	watched.Wait()
	boot.Console, boot.Elapsed = console.String(), time.Since(start)
	if err != nil {
		return boot, fmt.Errorf("console of %s: %w", key, err)
	}
	if timedOut && !consoleEnded(ctx, c, key) {
		return boot, fmt.Errorf("the guest of %s did not power off within %v", key, timeout)
	}
	// The console ends when the domain stops; the instance follows.
	if err := WaitFor(2*time.Minute, time.Second, func() (bool, error) { return consoleEnded(ctx, c, key), nil }); err != nil {
		return boot, fmt.Errorf("instance %s did not end after its console closed: %w\n%s", key, err, describeInstance(ctx, c, key))
	}
	return boot, nil
}

// consoleEnded tells whether instance key is gone or ended.
func consoleEnded(ctx context.Context, c client.Client, key types.NamespacedName) bool {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	err := c.Get(ctx, key, vmi)
	return apierrors.IsNotFound(err) || err == nil && vmi.IsFinal()
}

// SerialConsole copies the serial console of instance key to out, the way
// `virtctl console` reads it, until the console closes (the domain stopped)
// or ctx ends. It retries while virt-api answers 400 (the instance is not
// running yet), as virtctl does.
func SerialConsole(ctx context.Context, config *rest.Config, key types.NamespacedName, out io.Writer) error {
	var stream kvcorev1.StreamInterface
	if err := WaitFor(2*time.Minute, time.Second, func() (bool, error) {
		var err error
		stream, err = kvcorev1.AsyncSubresourceHelper(config, "virtualmachineinstances", key.Namespace, key.Name, "console", nil)
		// 400: the instance does not run yet. Only a refusal that waiting
		// cannot change ends the wait; a dial error or a 5xx while virt-api
		// is briefly unavailable is retried.
		var async *kvcorev1.AsyncSubresourceError
		if errors.As(err, &async) && slices.Contains([]int{http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound}, async.GetStatusCode()) {
			return false, Permanent(err)
		}
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("open the serial console: %w", err)
	}
	// The console is only read: its input never sends, and closes last.
	in, inWriter := io.Pipe()
	defer inWriter.Close()
	done := make(chan error, 1)
	go func() { done <- stream.Stream(kvcorev1.StreamOptions{In: in, Out: out}) }()
	select {
	case err := <-done:
		// virt-handler drops the connection without a close frame when
		// the domain stops: `virtctl console` reports it as a disconnect.
		if err == nil || websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseAbnormalClosure) || errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case <-ctx.Done():
		_ = stream.AsConn().Close()
		<-done
		return nil
	}
}

// describeInstance says what `kubectl describe` says of a VMI that does
// not run: its conditions that do not hold, its launcher pod, and both
// objects' Events.
func describeInstance(ctx context.Context, c client.Client, key types.NamespacedName) string {
	var b strings.Builder
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := c.Get(ctx, key, vmi); err != nil {
		fmt.Fprintf(&b, "instance %s: %v\n", key, err)
	} else {
		fmt.Fprintf(&b, "instance %s: %s\n", key, vmi.Status.Phase)
		for _, cond := range vmi.Status.Conditions {
			if cond.Status != corev1.ConditionTrue {
				fmt.Fprintf(&b, "  condition %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
			}
		}
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(key.Namespace)); err == nil {
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, "virt-launcher-"+key.Name+"-") {
				fmt.Fprintf(&b, "pod %s: %s\n", p.Name, DescribePod(&p))
			}
		}
	}
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(key.Namespace)); err == nil {
		for _, e := range events.Items {
			if e.InvolvedObject.Name == key.Name || strings.HasPrefix(e.InvolvedObject.Name, "virt-launcher-"+key.Name+"-") {
				fmt.Fprintf(&b, "event %s %s: %s %s: %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
			}
		}
	}
	return b.String()
}

// MachineProcess is a process on this machine and who started it.
type MachineProcess struct {
	PID     int
	Command string // argv[0]'s base name
	// UnderShim: a containerd shim is among its ancestors, and the node's
	// init among the shim's: the node's containerd started it, for a pod.
	UnderShim bool
	// OfTestBed: this test process is among its ancestors with no
	// containerd shim in between: the test bed started it itself.
	OfTestBed bool
}

// kubeVirtCommands are the node processes that run a KubeVirt VM.
var kubeVirtCommands = []string{"virt-handler", "virt-launcher", "virt-launcher-monitor", "libvirtd", "virtqemud", "qemu-system-x86_64"}

// watchKubeVirtProcesses samples the machine's KubeVirt processes every few
// seconds until ctx ends, and returns every one it saw, as node n's.
func watchKubeVirtProcesses(ctx context.Context, n *Node) []MachineProcess {
	seen := map[int]MachineProcess{}
	for {
		procs, _ := MachineProcesses(n.init, kubeVirtCommands...)
		for _, p := range procs {
			seen[p.PID] = p
		}
		select {
		case <-ctx.Done():
			out := make([]MachineProcess, 0, len(seen))
			for _, p := range seen {
				out = append(out, p)
			}
			slices.SortFunc(out, func(a, b MachineProcess) int { return a.PID - b.PID })
			return out
		case <-time.After(3 * time.Second):
		}
	}
}

// MachineProcesses lists this machine's processes whose command (argv[0]'s
// base name) is one of commands, with who started them, from one reading
// of the process table (processes). nodeInit is the host PID of a node's
// init: only a shim that descends from it is that node's containerd's, so
// a shim of any other containerd on the machine does not count.
func MachineProcesses(nodeInit int, commands ...string) ([]MachineProcess, error) {
	procs, err := processes()
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	// descends tells whether ancestor is among pid's ancestors.
	descends := func(pid, ancestor int) bool {
		for p := procs[pid].ppid; p > 1; p = procs[p].ppid {
			if p == ancestor {
				return true
			}
		}
		return false
	}
	var out []MachineProcess
	for pid := range procs {
		cmd := processCommand(pid)
		if !slices.Contains(commands, cmd) {
			continue
		}
		p := MachineProcess{PID: pid, Command: cmd}
		for ancestor := procs[pid].ppid; ancestor > 1; ancestor = procs[ancestor].ppid {
			if strings.HasPrefix(processCommand(ancestor), "containerd-shim") {
				p.UnderShim = descends(ancestor, nodeInit)
				break
			}
			if ancestor == self {
				p.OfTestBed = true
				break
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// processCommand is the base name of pid's argv[0], "" when gone.
func processCommand(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(data) == 0 {
		return ""
	}
	argv0, _, _ := bytes.Cut(data, []byte{0})
	return filepath.Base(string(argv0))
}
