package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeImage is a guest image that qemu-img accepts as a backing file; the
// tests below prepare a boot without booting it.
func fakeImage(t *testing.T) GuestImage {
	t.Helper()
	dir := t.TempDir()
	img := GuestImage{Dir: dir, Root: filepath.Join(dir, "root.img"), Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
	if err := os.WriteFile(img.Root, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	return img
}

func isoVolumeID(t *testing.T, iso string) string {
	t.Helper()
	out, err := Run(context.Background(), time.Minute, t.TempDir(), nil, "xorriso", "-indev", iso, "-pvd_info")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Volume Id" {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no Volume Id in:\n%s", out)
	return ""
}

func TestGuestPrepareBuildsSeedAndDisksAsKubeVirtDoes(t *testing.T) {
	RequireTestBed(t) // qemu-img and xorriso
	g := &Guest{dir: t.TempDir()}
	g.ConsoleLog = filepath.Join(g.dir, "console.log")
	args, err := g.prepare(fakeImage(t), GuestOptions{
		UserData:   []byte("#cloud-config\n"),
		InstanceID: "vm-1",
		ExtraDisks: []GuestDisk{{Files: map[string][]byte{"a/b.txt": []byte("x")}, Label: "guestbackup", Serial: "guestbackup"}},
	})
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	joined := strings.Join(args, " ")
	for _, want := range []string{
		"-no-reboot", "-accel tcg", "virtio-blk-pci,drive=disk0,serial=guestbackup",
		"-netdev user,id=n0,restrict=off", "root=/dev/vda rw console=ttyS0",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("qemu arguments lack %q: %s", want, joined)
		}
	}
	if strings.Contains(joined, "hostfwd") {
		t.Errorf("qemu forwards a host port: %s", joined)
	}
	if got := isoVolumeID(t, filepath.Join(g.dir, "seed.iso")); got != "cidata" {
		t.Errorf("seed volume ID = %q, want cidata", got)
	}
	if got := isoVolumeID(t, filepath.Join(g.dir, "disk0.iso")); got != "guestbackup" {
		t.Errorf("disk volume ID = %q, want guestbackup", got)
	}
	out, err := Run(context.Background(), time.Minute, g.dir, nil, "xorriso", "-indev", filepath.Join(g.dir, "seed.iso"), "-find", "/", "-type", "f")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, name := range []string{"'/user-data'", "'/meta-data'"} {
		if !strings.Contains(out, name) {
			t.Errorf("seed lacks %s:\n%s", name, out)
		}
	}
}

func TestGuestPrepareRejectsWhatKubeVirtRejects(t *testing.T) {
	RequireTestBed(t) // qemu-img and xorriso
	for name, tc := range map[string]struct {
		disk GuestDisk
		want string
	}{
		"serial with a comma": {GuestDisk{Serial: "a,b"}, "serial"},
		"serial with a space": {GuestDisk{Serial: "a b"}, "serial"},
		"label too long":      {GuestDisk{Label: strings.Repeat("x", 33)}, "label"},
		"file outside":        {GuestDisk{Files: map[string][]byte{"../x": nil}}, "leaves the disk"},
	} {
		t.Run(name, func(t *testing.T) {
			g := &Guest{dir: t.TempDir()}
			_, err := g.prepare(fakeImage(t), GuestOptions{InstanceID: "vm-1", ExtraDisks: []GuestDisk{tc.disk}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("prepare: got %v, want an error about %s", err, tc.want)
			}
		})
	}
}

// A VM's boots share its disk and its instance-id, as KubeVirt's do: the
// overlay is made once and never replaced, and no boot makes up an id.
func TestGuestPrepareKeepsTheVMsDiskAndInstanceID(t *testing.T) {
	RequireTestBed(t) // qemu-img and xorriso
	image := fakeImage(t)
	disk := filepath.Join(t.TempDir(), "vms", "web.qcow2")
	prepare := func(opts GuestOptions) ([]string, error) {
		g := &Guest{dir: t.TempDir()}
		g.ConsoleLog = filepath.Join(g.dir, "console.log")
		return g.prepare(image, opts)
	}
	if _, err := prepare(GuestOptions{InstanceID: "uuid-1", RootDisk: disk}); err != nil {
		t.Fatalf("first boot: %v", err)
	}
	// What the guest wrote: a stand-in byte at the overlay's end.
	f, err := os.OpenFile(disk, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("written by the first boot"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	before, _ := os.ReadFile(disk)
	args, err := prepare(GuestOptions{InstanceID: "uuid-1", RootDisk: disk})
	if err != nil {
		t.Fatalf("second boot: %v", err)
	}
	if after, _ := os.ReadFile(disk); string(after) != string(before) {
		t.Error("the second boot replaced the VM's disk")
	}
	if !strings.Contains(strings.Join(args, " "), "file="+disk+",if=none,id=root,format=qcow2") {
		t.Errorf("the guest does not boot from its own disk: %v", args)
	}
	if _, err := prepare(GuestOptions{RootDisk: disk}); err == nil || !strings.Contains(err.Error(), "instance-id") {
		t.Errorf("a boot without an instance-id: got %v, want an error naming it", err)
	}
	if a, b := FreshInstanceID(), FreshInstanceID(); a == b {
		t.Errorf("two fresh instance-ids are both %q", a)
	}
}

func TestQemuEscapeDoublesCommas(t *testing.T) {
	if got := qemuEscape("/tmp/a,b/c"); got != "/tmp/a,,b/c" {
		t.Fatalf("qemuEscape = %q", got)
	}
}

// failedTB is a test that has failed: it records its cleanups and logs.
type failedTB struct {
	*testing.T
	cleanups ownCleanups
	logs     []string
}

func (f *failedTB) Failed() bool      { return true }
func (f *failedTB) Cleanup(fn func()) { f.cleanups.add(fn) }
func (f *failedTB) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

// A guest that never powers off is killed at its timeout, Wait says so, and
// the failed test keeps its console.
func TestGuestIsKilledAtItsTimeout(t *testing.T) {
	RequireTestBed(t)
	tb := &failedTB{T: t}
	defer func() {
		tb.cleanups.run()
		kept := regexp.MustCompile(`guest console kept in (\S+);`).FindStringSubmatch(strings.Join(tb.logs, "\n"))
		if kept == nil {
			t.Fatalf("no kept console in the failed test's logs: %q", tb.logs)
		}
		data, err := os.ReadFile(kept[1])
		if err != nil || !strings.Contains(string(data), "Linux version") {
			t.Errorf("kept console %s: %v %q", kept[1], err, tail(kept[1], 5))
		}
		os.RemoveAll(filepath.Dir(kept[1]))
	}()
	g := StartGuest(tb, GuestOptions{UserData: []byte("#cloud-config\n"), InstanceID: FreshInstanceID(), Timeout: 15 * time.Second})
	// No stopwatch on Wait: without its timeout it would never return for
	// a guest that never powers off, and the error says it was the timeout.
	res, err := g.Wait()
	// Either budget may end it: a busy machine may give qemu less than a
	// third of a core, and then its wall-clock budget runs out first.
	if err == nil || !strings.Contains(err.Error(), "did not power off") {
		t.Fatalf("Wait: got %v, want a timeout", err)
	}
	if exited, _ := g.Process.Exited(); !exited {
		t.Error("qemu still runs after the timeout")
	}
	if !strings.Contains(res.Console, "Linux version") {
		t.Errorf("console holds no kernel boot: %q", tail(g.ConsoleLog, 5))
	}
}

// A guest's budget is qemu's CPU time, not the wall clock's: a guest that
// keeps qemu busy without powering off is killed once it used its budget,
// however long a busy machine took to give it that much; one that waits,
// using little CPU, is killed at guestWallFactor times its budget of wall
// time. Stand-ins for qemu (a busy loop, a sleep) make each budget the
// only one that can end its case.
func TestGuestBudgets(t *testing.T) {
	for _, tc := range []struct {
		name          string
		args          []string
		timeout, wall time.Duration
		want          string
	}{
		{"a busy guest spends its CPU", []string{"-c", "while :; do :; done"}, time.Second, 10 * time.Minute, "within 1s of CPU"},
		{"a waiting guest spends its wall time", []string{"-c", "exec sleep 600"}, time.Hour, time.Second, "within 1s (it ran"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Guest{timeout: tc.timeout, wall: tc.wall, dir: t.TempDir(), Started: time.Now()}
			g.ConsoleLog = filepath.Join(g.dir, "console.log")
			g.Process = StartProcess(t, ProcessSpec{Name: "guest", Path: "/bin/sh", Args: tc.args})
			res, err := g.Wait()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Wait: %v, want killed %q", err, tc.want)
			}
			if exited, _ := g.Process.Exited(); !exited {
				t.Error("the guest still runs")
			}
			if tc.timeout == time.Second && res.CPU < time.Second {
				t.Errorf("killed after %v of CPU, want its budget of 1s", res.CPU)
			}
			if tc.wall == time.Second && res.CPU > res.Elapsed/2 {
				t.Errorf("a sleeping guest used %v of CPU in %v", res.CPU, res.Elapsed)
			}
		})
	}
}

// TestProcessCPU: a running process's CPU time, read from /proc, is what
// the kernel accounts it (getrusage), not its age: this test's own
// process, which spends CPU in two threads, and has lived longer than that.
func TestProcessCPU(t *testing.T) {
	spin := func() {
		defer runtime.UnlockOSThread()
		runtime.LockOSThread()
		for start := ThreadCPU(); ThreadCPU()-start < 300*time.Millisecond; {
		}
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(spin)
	}
	wg.Wait()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	kernel := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	got, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// /proc counts in 10 ms ticks, and the test keeps running between the
	// two reads.
	if got < 600*time.Millisecond || got < kernel-50*time.Millisecond || got > kernel+200*time.Millisecond {
		t.Errorf("processCPU = %v, getrusage says %v (both threads spun 300ms each)", got, kernel)
	}
}
