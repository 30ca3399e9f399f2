package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// stopGrace is how long a process has to exit after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// ProcessSpec describes a process to start.
type ProcessSpec struct {
	// Name identifies the process in logs and errors.
	Name string
	// Path is the binary; Args are its arguments (never secrets: pass those in Env).
	Path string
	Args []string
	// Env is added to a minimal environment (PATH, HOME=Dir).
	Env []string
	// Dir is the working directory and HOME; a temporary one when empty.
	Dir string
	// StopSignal is what Stop sends first; SIGTERM when zero.
	StopSignal syscall.Signal
}

// Process is a running child process, in its own process group so that
// stopping it stops everything it started.
type Process struct {
	Spec    ProcessSpec
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done closes

	stopOnce sync.Once
}

// StartProcess starts spec with stdout and stderr captured in a log file. The
// test's cleanup stops it and, when the test failed, prints the log's tail.
func StartProcess(tb TB, spec ProcessSpec) *Process {
	tb.Helper()
	p, err := startProcess(tb.TempDir(), spec)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		p.Stop()
		if tb.Failed() {
			tb.Logf("%s log (%s):\n%s", spec.Name, p.LogPath, tail(p.LogPath, 60))
		}
	})
	return p
}

func startProcess(tmp string, spec ProcessSpec) (*Process, error) {
	mustBeGranted(spec.Path)
	if spec.Dir == "" {
		spec.Dir = filepath.Join(tmp, spec.Name)
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return nil, err
	}
	logPath := filepath.Join(tmp, spec.Name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Dir = spec.Dir
	cmd.Env = append(baseEnv(spec.Dir), spec.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group: Stop signals the group, so grandchildren go too.
	// Pdeathsig: if the test binary dies, the kernel kills the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	p := &Process{Spec: spec, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// baseEnv is a minimal environment, so a developer's settings (KOPIA_*,
// KUBECONFIG, proxies) never leak into a test's processes.
func baseEnv(home string) []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8"}
}

// Exited reports whether the process has exited, and its error if so.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends the spec's StopSignal (SIGTERM) to the process group, then
// SIGKILL after a grace period, and waits for the process to be reaped. It
// is safe to call twice.
func (p *Process) Stop() {
	p.stopOnce.Do(func() {
		pgid := -p.cmd.Process.Pid
		sig := p.Spec.StopSignal
		if sig == 0 {
			sig = syscall.SIGTERM
		}
		_ = syscall.Kill(pgid, sig)
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			_ = syscall.Kill(pgid, syscall.SIGKILL)
			<-p.done
		}
		// Anything of the group that outlived its leader goes now.
		_ = syscall.Kill(pgid, syscall.SIGKILL)
	})
}

// CPU is the CPU time the process has used so far, all its threads, user
// and system; once it exited, its whole life's.
func (p *Process) CPU() (time.Duration, error) {
	select {
	case <-p.done:
		state := p.cmd.ProcessState
		if state == nil {
			return 0, fmt.Errorf("%s: no exit status: %w", p.Spec.Name, p.err)
		}
		return state.UserTime() + state.SystemTime(), nil
	default:
	}
	return processCPU(p.cmd.Process.Pid)
}

// processCPU is a running process's CPU time from /proc/PID/stat, whose
// utime and stime (the 14th and 15th fields) count USER_HZ ticks, 100 a
// second on Linux whatever the kernel's own tick.
func processCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, stat)
	}
	fields := strings.Fields(string(stat[end+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, stat)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	const userHZ = 100
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// Log returns what the process wrote so far.
func (p *Process) Log() string {
	data, _ := os.ReadFile(p.LogPath)
	return string(data)
}

// Run runs a short-lived command to completion within timeout and returns its
// combined output. Secrets go in env, never in args.
func Run(ctx context.Context, timeout time.Duration, dir string, env []string, path string, args ...string) (string, error) {
	mustBeGranted(path)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = dir
	cmd.Env = append(baseEnv(dir), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return string(out), fmt.Errorf("%s %s: timed out after %v", filepath.Base(path), strings.Join(args, " "), timeout)
	}
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", filepath.Base(path), strings.Join(args, " "), err)
	}
	return string(out), nil
}

// WaitFor polls cond every interval until it returns true or timeout
// passes. An error from cond does not end the wait (a server that is not
// up yet refuses connections); the last one explains a timeout. An error
// made by Permanent ends it at once: waiting longer cannot help.
func WaitFor(timeout, interval time.Duration, cond func() (bool, error)) error {
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), interval, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		if err != nil {
			last = err
		}
		var permanent permanentError
		if errors.As(err, &permanent) {
			return false, permanent.error
		}
		return ok, nil
	})
	var permanent permanentError
	switch {
	case err == nil:
		return nil
	case errors.As(last, &permanent):
		return permanent.error
	case last != nil:
		return fmt.Errorf("not ready after %v: %w", timeout, last)
	}
	return fmt.Errorf("not ready after %v", timeout)
}

// permanentError is an error that ends a WaitFor.
type permanentError struct{ error }

// Permanent marks err, returned by a WaitFor condition, as one that ends
// the wait at once (an instance that failed will not run).
func Permanent(err error) error { return permanentError{err} }

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
