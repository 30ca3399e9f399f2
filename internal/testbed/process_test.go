package testbed

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStopLeavesNoOrphans starts a shell that forks a grandchild, stops the
// shell, and checks that the grandchild is gone too.
func TestStopLeavesNoOrphans(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	p := StartProcess(t, ProcessSpec{
		Name: "forker",
		Path: "/bin/sh",
		Args: []string{"-c", `sleep 600 & echo $! > "$PIDFILE"; wait`},
		Env:  []string{"PIDFILE=" + pidFile},
	})
	var pid int
	if err := WaitFor(10*time.Second, 20*time.Millisecond, func() (bool, error) {
		data, err := os.ReadFile(pidFile)
		if err != nil {
			return false, err
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil, err
	}); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	if exited, _ := p.Exited(); !exited {
		t.Fatal("process still running after Stop")
	}
	if err := WaitFor(5*time.Second, 20*time.Millisecond, func() (bool, error) {
		return syscall.Kill(pid, 0) == syscall.ESRCH, nil
	}); err != nil {
		t.Fatalf("grandchild %d outlived Stop: %v", pid, err)
	}
	p.Stop() // a second Stop is harmless
}

// TestRunTimesOut: Run stops a command at its time-out. No stopwatch: a Run
// that waited for the command instead would hang here for an hour, until go
// test's -timeout names this test, and a slow machine cannot fail it.
func TestRunTimesOut(t *testing.T) {
	_, err := Run(t.Context(), 200*time.Millisecond, t.TempDir(), nil, "/bin/sleep", "3600")
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("error = %v, want a time-out", err)
	}
}

func TestRunKeepsTheEnvironmentMinimal(t *testing.T) {
	t.Setenv("KOPIA_PASSWORD", "from-the-developer")
	out, err := Run(t.Context(), 10*time.Second, t.TempDir(), []string{"EXTRA=1"}, "/usr/bin/env")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "KOPIA_PASSWORD") || !strings.Contains(out, "EXTRA=1") {
		t.Fatalf("environment leaked or lost:\n%s", out)
	}
}

// TestFreePortsBelowTheEphemeralRange: a server's port and its client port
// (the next) are free together and below the kernel's ephemeral range, so
// no outgoing connection takes one before the server binds it.
func TestFreePortsBelowTheEphemeralRange(t *testing.T) {
	for _, n := range []int{1, 2} {
		first, err := FreePorts(n)
		if err != nil {
			t.Fatalf("FreePorts(%d): %v", n, err)
		}
		if last := first + n - 1; last >= ephemeralLow() {
			t.Errorf("FreePorts(%d) = %d..%d, not below the ephemeral range (%d)", n, first, last, ephemeralLow())
		}
		if !portsFree(first, n) {
			t.Errorf("FreePorts(%d) = %d: not all %d free", n, first, n)
		}
	}
}

// TestMachineProcessesTellsWhoStartedThem: a process this test starts is
// the test bed's, with no containerd shim among its ancestors.
func TestMachineProcessesTellsWhoStartedThem(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	procs, err := MachineProcesses("sleep")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(procs, func(p MachineProcess) bool { return p.PID == cmd.Process.Pid })
	if i < 0 {
		t.Fatalf("sleep[%d] not among %v", cmd.Process.Pid, procs)
	}
	if got := procs[i]; !got.OfTestBed || got.UnderShim {
		t.Errorf("sleep started by this test: %+v, want OfTestBed and not UnderShim", got)
	}
}
