package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	// DefaultGuestTimeout is a guest's CPU budget when GuestOptions sets
	// none: under software emulation, boot to cloud-init's end takes 40-90 s
	// of qemu's CPU.
	DefaultGuestTimeout = 8 * time.Minute
	// guestWallFactor bounds a guest's wall-clock life at this many times
	// its CPU budget: a guest that waits (on a server that never answers,
	// say) uses little CPU and would otherwise never be killed. The wall
	// clock is the scheduler's: on a busy machine qemu gets a fraction of a
	// core, and the same boot takes that much longer.
	guestWallFactor = 3
	// guestCPUCheck is how often Wait reads qemu's CPU time.
	guestCPUCheck = time.Second
	// guestMemoryMiB is the guest's RAM.
	guestMemoryMiB = 1024
	// guestCPU is the CPU qemu emulates. Under TCG every instruction is
	// translated, and on a richer model the guest's libraries pick vector
	// code (glibc's AVX2 string functions, say) that TCG runs no faster
	// than the baseline code, and udev loads a module for each feature.
	// qemu64, the baseline every amd64 binary (Debian's, kopia's) is
	// built for, took 13% less of qemu's CPU per boot than "max" here
	// (four pairs of boots, see README.md); the guest's CPU is the suites'
	// largest cost. It proves nothing about the product either way.
	guestCPU = "qemu64"
	// guestToolTimeout bounds building a seed ISO or an overlay.
	guestToolTimeout = time.Minute
	// guestPowerDown is what the guest's kernel prints when it powers off.
	guestPowerDown = "reboot: Power down"
)

// GuestHostAddress is how a guest reaches the host's loopback (qemu user
// networking): a server on 127.0.0.1:<port> is https://10.0.2.2:<port> to it.
const GuestHostAddress = "10.0.2.2"

// GuestDisk is a read-only ISO 9660 disk for a guest, as KubeVirt makes of a
// Secret or ConfigMap volume: its files at the root, its volume label, and
// the disk's serial (/dev/disk/by-id/virtio-<serial> in the guest).
type GuestDisk struct {
	// Files by name; a name may hold slashes for subfolders.
	Files map[string][]byte
	// Label is the ISO's volume ID (/dev/disk/by-label/<label>), at most 32
	// characters; empty: no label.
	Label string
	// Serial is the virtio disk's serial, KubeVirt's rules: [A-Za-z0-9_.+-],
	// and the guest sees its first 20 characters; empty: none.
	Serial string
	// ISO, when set, is the disk's image, already built (by KubeVirt's
	// pkg/config, say): Files and Label are then unused.
	ISO string
}

// GuestOptions describes one boot of the test bed's Linux guest.
type GuestOptions struct {
	// Seed, when set, is the cloud-init seed's image, already built (by
	// KubeVirt's pkg/cloud-init, say): UserData, MetaData and InstanceID
	// are then unused.
	Seed string
	// UserData is the NoCloud user-data, as KubeVirt would deliver it from
	// a cloudInitNoCloud volume. It should end with the guest powering
	// itself off (power_state: {mode: poweroff}, or `systemctl poweroff`).
	UserData []byte
	// MetaData is the NoCloud meta-data; empty: an instance-id of
	// InstanceID.
	MetaData []byte
	// InstanceID identifies the instance to cloud-init, which runs its
	// per-instance modules (write_files, runcmd) only for an id it has not
	// seen on the guest's disk. A VM's boots share one id, as in KubeVirt
	// (its firmware UUID); a test that wants a never-seen VM says so with
	// FreshInstanceID. Required unless MetaData is given.
	InstanceID string
	// RootDisk is the file of the VM's own root disk, a copy-on-write
	// overlay of the test bed's image: created at the first boot and kept,
	// so every later boot of the VM finds what earlier ones wrote, as a VM
	// on a persistent volume does. Empty: a disk for this boot alone,
	// removed with the test.
	RootDisk string
	// ExtraDisks are attached after the root disk and the seed, in order.
	ExtraDisks []GuestDisk
	// Timeout is the guest's CPU budget: qemu is killed once it used that
	// much CPU time, or lived guestWallFactor times as long, without the
	// guest powering off. Default DefaultGuestTimeout.
	Timeout time.Duration
	// Stock boots the stock-like image (hack/guest-image.sh build stock):
	// cloud-init, curl and python3, no kopia, nothing of guestbackup's.
	Stock bool
}

// Guest is a test bed guest running under qemu (TCG, no KVM) with the
// test bed's Debian image under the VM's own copy-on-write overlay, and a
// NoCloud seed.
type Guest struct {
	// ConsoleLog is the serial console's log file.
	ConsoleLog string
	// Started is when qemu started.
	Started time.Time
	// Process is qemu.
	Process *Process

	// timeout is qemu's CPU budget, wall its wall-clock one.
	timeout, wall time.Duration
	dir           string
}

// GuestResult is how a guest's boot ended.
type GuestResult struct {
	// Console is everything the guest wrote to its serial console.
	Console string
	// Elapsed is the guest's wall-clock time, from qemu's start to when
	// Wait saw it end.
	Elapsed time.Duration
	// CPU is the CPU time qemu's threads used, user and system. It grows
	// with the guest's work and does not with the machine's load, which
	// only stretches Elapsed; an idle guest adds little to it.
	CPU time.Duration
}

var (
	diskSerialPattern = regexp.MustCompile(`^[A-Za-z0-9_.+-]+$`)
	volumeIDPattern   = regexp.MustCompile(`^[A-Za-z0-9_.+ -]{1,32}$`)
)

// BootGuest boots the test bed's Linux guest with opts and waits for it to
// power itself off, within its CPU budget (opts.Timeout). It fails the test
// when qemu cannot start, the guest does not power off in time (it is then
// killed),
// or qemu exits any other way. The test's cleanup always stops qemu and,
// when the test failed, keeps the console log and prints its tail.
func BootGuest(tb TB, opts GuestOptions) GuestResult {
	tb.Helper()
	g := StartGuest(tb, opts)
	res, err := g.Wait()
	if err != nil {
		tb.Fatalf("guest: %v\nconsole (%s), last lines:\n%s", err, g.ConsoleLog, tail(g.ConsoleLog, 60))
	}
	return res
}

// StartGuest boots the guest like BootGuest and returns at once; Wait waits
// for it to power off.
func StartGuest(tb TB, opts GuestOptions) *Guest {
	tb.Helper()
	RequireTestBed(tb)
	load := LoadGuestImage
	if opts.Stock {
		load = LoadStockGuestImage
	}
	image, err := load()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		tb.Fatalf("qemu-system-x86_64 is not installed (run `make tools`): %v", err)
	}
	g := &Guest{timeout: opts.Timeout, dir: tb.TempDir()}
	if g.timeout <= 0 {
		g.timeout = DefaultGuestTimeout
	}
	g.wall = guestWallFactor * g.timeout
	g.ConsoleLog = filepath.Join(g.dir, "console.log")
	args, err := g.prepare(image, opts)
	if err != nil {
		tb.Fatalf("prepare guest: %v", err)
	}
	// Registered before qemu starts, so it runs after qemu's own cleanup
	// has stopped it: the log is then complete.
	tb.Cleanup(func() {
		if tb.Failed() {
			g.keepConsole(tb)
		}
	})
	g.Started = time.Now()
	g.Process = StartProcess(tb, ProcessSpec{
		Name: "qemu-guest",
		Path: "qemu-system-x86_64",
		Args: args,
		Dir:  filepath.Join(g.dir, "qemu"),
	})
	return g
}

// Wait waits for the guest to power itself off. qemu is killed, and Wait
// fails, once it has used the guest's CPU budget or lived its wall-clock
// one without that.
func (g *Guest) Wait() (GuestResult, error) {
	wall := time.NewTimer(time.Until(g.Started.Add(g.wall)))
	defer wall.Stop()
	check := time.NewTicker(guestCPUCheck)
	defer check.Stop()
	for exited := false; !exited; {
		select {
		case <-g.Process.done:
			exited = true
		case <-wall.C:
			if exited = g.exited(); !exited {
				return g.kill(fmt.Sprintf("within %v", g.wall))
			}
		case <-check.C:
			// A read that fails means qemu just exited: done says so next.
			if cpu, err := g.Process.CPU(); err == nil && cpu >= g.timeout {
				if exited = g.exited(); !exited {
					return g.kill(fmt.Sprintf("within %v of CPU", g.timeout))
				}
			}
		}
	}
	res := g.result()
	if g.Process.err != nil {
		return res, fmt.Errorf("qemu exited after %v: %w: %s", res.Elapsed.Round(time.Second), g.Process.err, tail(g.Process.LogPath, 20))
	}
	// qemu also exits 0 when a guest reboots (-no-reboot), after a panic
	// for one: only the kernel's power-down message proves a clean end.
	if !strings.Contains(res.Console, guestPowerDown) {
		return res, fmt.Errorf("qemu exited after %v without the guest powering off (%q not on the console)", res.Elapsed.Round(time.Second), guestPowerDown)
	}
	return res, nil
}

// exited reports whether qemu has exited: select picks at random among
// ready cases, and a guest that powered off as a budget ran out is not
// killed for it.
func (g *Guest) exited() bool {
	select {
	case <-g.Process.done:
		return true
	default:
		return false
	}
}

// kill stops qemu, whose guest did not power off within the budget
// named, and says so with both clocks.
func (g *Guest) kill(budget string) (GuestResult, error) {
	g.Process.Stop()
	res := g.result()
	return res, fmt.Errorf("did not power off %s (it ran %v, %v of CPU); killed", budget,
		res.Elapsed.Round(time.Second), res.CPU.Round(time.Second))
}

func (g *Guest) result() GuestResult {
	console, _ := os.ReadFile(g.ConsoleLog)
	cpu, _ := g.Process.CPU()
	return GuestResult{Console: string(console), Elapsed: time.Since(g.Started), CPU: cpu}
}

// keepConsole copies the console log out of the test's temporary folder,
// which the test removes, and prints its tail.
func (g *Guest) keepConsole(tb TB) {
	kept := g.ConsoleLog
	if dir, err := os.MkdirTemp("", "guestbackup-guest-console-"); err == nil {
		if data, err := os.ReadFile(g.ConsoleLog); err == nil {
			if err := os.WriteFile(filepath.Join(dir, "console.log"), data, 0o600); err == nil {
				kept = filepath.Join(dir, "console.log")
			}
		}
	}
	tb.Logf("guest console kept in %s; last lines:\n%s", kept, tail(kept, 80))
}

// prepare writes the overlay, the seed and the extra disks, and returns
// qemu's arguments.
func (g *Guest) prepare(image GuestImage, opts GuestOptions) ([]string, error) {
	ctx := context.Background()
	metaData := opts.MetaData
	if len(metaData) == 0 && opts.Seed == "" {
		if opts.InstanceID == "" {
			return nil, errors.New("no instance-id: give the VM's own (KubeVirt's is its firmware UUID) or, for a VM never booted before, FreshInstanceID()")
		}
		if strings.ContainsAny(opts.InstanceID, "\n\r") {
			return nil, fmt.Errorf("instance-id %q spans lines", opts.InstanceID)
		}
		metaData = []byte("instance-id: " + opts.InstanceID + "\nlocal-hostname: guest\n")
	}
	overlay := opts.RootDisk
	if overlay == "" {
		overlay = filepath.Join(g.dir, "root.qcow2")
	}
	// The image stays clean: the guest writes into its own overlay, made
	// once per VM.
	if _, err := os.Stat(overlay); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(overlay), 0o755); err != nil {
			return nil, fmt.Errorf("root disk: %w", err)
		}
		if out, err := Run(ctx, guestToolTimeout, g.dir, nil, "qemu-img", "create", "-q", "-f", "qcow2",
			"-b", image.Root, "-F", "raw", overlay); err != nil {
			return nil, fmt.Errorf("create root disk %s: %w: %s", overlay, err, out)
		}
	} else if err != nil {
		return nil, fmt.Errorf("root disk: %w", err)
	}
	seed := opts.Seed
	if seed == "" {
		seed = filepath.Join(g.dir, "seed.iso")
		if err := makeISO(ctx, g.dir, seed, "cidata", map[string][]byte{"user-data": opts.UserData, "meta-data": metaData}); err != nil {
			return nil, fmt.Errorf("NoCloud seed: %w", err)
		}
	}
	args := []string{
		"-machine", "q35", "-accel", "tcg", "-cpu", guestCPU, "-m", strconv.Itoa(guestMemoryMiB),
		"-nographic", "-no-reboot", "-monitor", "none",
		"-serial", "file:" + qemuEscape(g.ConsoleLog),
		"-kernel", qemuEscape(image.Kernel), "-initrd", qemuEscape(image.Initrd),
		"-append", "root=/dev/vda rw console=ttyS0",
		// Devices in order: the root disk is vda, the seed vdb, then the
		// extra disks.
		"-drive", "file=" + qemuEscape(overlay) + ",if=none,id=root,format=qcow2",
		"-device", "virtio-blk-pci,drive=root",
		"-drive", "file=" + qemuEscape(seed) + ",if=none,id=seed,format=raw,readonly=on",
		"-device", "virtio-blk-pci,drive=seed",
	}
	for i, d := range opts.ExtraDisks {
		if d.Serial != "" && !diskSerialPattern.MatchString(d.Serial) {
			return nil, fmt.Errorf("disk %d: serial %q does not match %s", i, d.Serial, diskSerialPattern)
		}
		iso := d.ISO
		if iso == "" {
			if d.Label != "" && !volumeIDPattern.MatchString(d.Label) {
				return nil, fmt.Errorf("disk %d: label %q does not match %s", i, d.Label, volumeIDPattern)
			}
			iso = filepath.Join(g.dir, fmt.Sprintf("disk%d.iso", i))
			if err := makeISO(ctx, g.dir, iso, d.Label, d.Files); err != nil {
				return nil, fmt.Errorf("disk %d: %w", i, err)
			}
		}
		id := fmt.Sprintf("disk%d", i)
		device := "virtio-blk-pci,drive=" + id
		if d.Serial != "" {
			device += ",serial=" + d.Serial
		}
		args = append(args,
			"-drive", "file="+qemuEscape(iso)+",if=none,id="+id+",format=raw,readonly=on",
			"-device", device)
	}
	// User networking: the guest reaches the host's loopback at
	// GuestHostAddress; no host port is forwarded to the guest.
	args = append(args,
		"-netdev", "user,id=n0,restrict=off",
		"-device", "virtio-net-pci,netdev=n0",
		"-device", "virtio-rng-pci",
	)
	return args, nil
}

// makeISO writes files into a folder and makes an ISO of it the way KubeVirt
// makes its NoCloud and Secret disks: xorrisofs with Joliet and Rock Ridge.
func makeISO(ctx context.Context, dir, iso, label string, files map[string][]byte) error {
	src, err := os.MkdirTemp(dir, "iso-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := filepath.Join(src, filepath.FromSlash(name))
		if name == "" || !strings.HasPrefix(p, src+string(filepath.Separator)) {
			return fmt.Errorf("file name %q leaves the disk", name)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			return err
		}
	}
	args := []string{"-quiet", "-output", iso}
	if label != "" {
		args = append(args, "-volid", label)
	}
	args = append(args, "-joliet", "-rock", src)
	if out, err := Run(ctx, guestToolTimeout, dir, nil, "xorrisofs", args...); err != nil {
		return fmt.Errorf("make %s: %w: %s", filepath.Base(iso), err, out)
	}
	return nil
}

// qemuEscape doubles commas, qemu's escape in option values.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// FreshInstanceID is an instance-id no guest has seen: the boot of a VM
// that never booted before, for a test that wants exactly that.
func FreshInstanceID() string { return "guest-" + randomHex(6) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// GuestImage is the test bed's guest image, built by hack/guest-image.sh:
// a Debian bookworm root file system with systemd, cloud-init (NoCloud),
// kopia at /usr/local/bin/kopia and guestbackup's disk-mode unit enabled.
type GuestImage struct {
	// Dir holds the files below.
	Dir string
	// Root is the raw ext4 root file system (the guest's /dev/vda).
	Root string
	// Kernel and Initrd boot it.
	Kernel string
	Initrd string
}

// LoadGuestImage finds the guest image through the test bed's tools and
// fails, telling what to run, when it is not built.
func LoadGuestImage() (GuestImage, error) {
	t, err := LoadTools()
	if err != nil {
		return GuestImage{}, err
	}
	return guestImage("GUESTBACKUP_GUEST_IMAGE", t.GuestImage, "build")
}

// LoadStockGuestImage is LoadGuestImage for the stock-like variant: no
// kopia, nothing of guestbackup's.
func LoadStockGuestImage() (GuestImage, error) {
	t, err := LoadTools()
	if err != nil {
		return GuestImage{}, err
	}
	return guestImage("GUESTBACKUP_GUEST_IMAGE_STOCK", t.GuestImageStock, "build stock")
}

func guestImage(env, dir, build string) (GuestImage, error) {
	if dir == "" {
		return GuestImage{}, fmt.Errorf("%s is not set: run `make tools`", env)
	}
	img := GuestImage{
		Dir:    dir,
		Root:   filepath.Join(dir, "root.img"),
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"),
	}
	for _, p := range []string{img.Root, img.Kernel, img.Initrd} {
		if info, err := os.Stat(p); err != nil || info.Size() == 0 {
			return img, fmt.Errorf("guest image %s is not built, run `make tools` (hack/guest-image.sh %s)", dir, build)
		}
	}
	return img, nil
}
