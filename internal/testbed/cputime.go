package testbed

import (
	"time"

	"golang.org/x/sys/unix"
)

// ThreadCPU is the CPU time the calling thread has used so far. Lock the
// goroutine to its thread (runtime.LockOSThread) around what it measures:
// the difference of two readings is then the CPU the work took, whatever
// else this machine's cores ran meanwhile. A benchmark on a shared machine
// reports it beside wall time, whose tail is the scheduler's.
func ThreadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic("clock_gettime(CLOCK_THREAD_CPUTIME_ID): " + err.Error()) // Linux always has it
	}
	return time.Duration(ts.Nano())
}
