package testbed

import "time"

// EventuallyTimeout is how long a spec waits, unless it says otherwise,
// for something a controller, a webhook or a server does in reaction to it:
// every Ginkgo suite sets it as Gomega's default in place of Gomega's 1 s,
// which a reconcile on a busy 2-core machine can take on its own. It bounds
// a failing spec's wait; a passing one waits only as long as the reaction.
const EventuallyTimeout = time.Minute

// SleepPastSecondOf sleeps until the clock reads a later second than t.
// Times in Kubernetes objects (creation, phase transitions, Events) have a
// resolution of a second: a spec that needs something to happen in a later
// second than t waits for that second to begin, rather than polling for it
// within a timeout a busy machine may miss.
func SleepPastSecondOf(t time.Time) {
	// Truncate drops the monotonic reading: time.Until compares wall clocks.
	time.Sleep(time.Until(t.Truncate(time.Second).Add(time.Second)))
}

// SuiteTimeout is how long a Ginkgo suite run by t may take: until shortly
// before go test's -timeout would end the binary (a minute, or a tenth of
// the time left when that is less), so that go test's flag is the one
// clock, and Ginkgo, not a panic, reports the spec that ran out and runs
// its cleanups. Ginkgo's own default of an hour ended test/kubevirt, whose
// boots are serial, on a busy machine while go test allowed 75 minutes.
// Without a deadline: Ginkgo's default.
func SuiteTimeout(t interface{ Deadline() (time.Time, bool) }) time.Duration {
	deadline, ok := t.Deadline()
	if !ok {
		return time.Hour
	}
	left := time.Until(deadline)
	return left - min(time.Minute, left/10)
}
