package testbed

import (
	"os"
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
// the test bed's; one a containerd shim starts is the node's only when the
// node's init is among the shim's ancestors.
func TestMachineProcessesTellsWhoStartedThem(t *testing.T) {
	// start runs a copy of sh named name with script and returns its PID.
	start := func(name, script string) int {
		t.Helper()
		sh := filepath.Join(t.TempDir(), name)
		data, err := os.ReadFile("/bin/sh")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(sh, data, 0o755); err != nil {
			t.Fatal(err)
		}
		return StartProcess(t, ProcessSpec{Name: name, Path: sh, Args: []string{"-c", script}}).cmd.Process.Pid
	}
	// sleepUnder is the sleep child of parent.
	sleepUnder := func(parent int) int {
		t.Helper()
		var child int
		if err := WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, error) {
			procs, err := processes()
			for pid, p := range procs {
				if p.ppid == parent && processCommand(pid) == "sleep" {
					child = pid
				}
			}
			return child != 0, err
		}); err != nil {
			t.Fatalf("no sleep under %d: %v", parent, err)
		}
		return child
	}
	shim := start("containerd-shim-runc-v2", "sleep 30 & wait")
	byShim := sleepUnder(shim)
	plain := start("sh", "sleep 30 & wait")
	byTest := sleepUnder(plain)

	for _, tc := range []struct {
		name     string
		pid      int
		nodeInit int
		want     MachineProcess
	}{
		{"started by this test", byTest, os.Getpid(), MachineProcess{OfTestBed: true}},
		{"started by a shim under the node's init", byShim, os.Getpid(), MachineProcess{UnderShim: true}},
		{"started by a shim of another node", byShim, plain, MachineProcess{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			procs, err := MachineProcesses(tc.nodeInit, "sleep")
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(procs, func(p MachineProcess) bool { return p.PID == tc.pid })
			if i < 0 {
				t.Fatalf("sleep[%d] not among %v", tc.pid, procs)
			}
			tc.want.PID, tc.want.Command = tc.pid, "sleep"
			if procs[i] != tc.want {
				t.Errorf("got %+v, want %+v", procs[i], tc.want)
			}
		})
	}
}
