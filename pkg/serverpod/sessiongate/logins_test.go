package sessiongate

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// admitted runs admit in the background and reports its outcome.
type admitted struct {
	done func(loginResult)
	err  error
}

func admitAsync(ctx context.Context, l *loginLimiter, source string) <-chan admitted {
	ch := make(chan admitted, 1)
	go func() {
		done, err := l.admit(ctx, source)
		ch <- admitted{done, err}
	}()
	return ch
}

// waitFor takes the outcome of an admission that must come now.
func waitFor(t *testing.T, ch <-chan admitted, what string) admitted {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not admitted", what)
		return admitted{}
	}
}

// stillWaiting checks that an admission has not come yet.
func stillWaiting(t *testing.T, ch <-chan admitted, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s: admitted (err %v), want it to wait", what, a.err)
	case <-time.After(50 * time.Millisecond):
	}
}

// waitUntil polls cond until it holds, failing after 10 s.
func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// pending is how many logins of source the limiter holds.
func (l *loginLimiter) pending(source string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sources[source]; s != nil {
		return s.pending
	}
	return 0
}

// waiting is how many logins of source wait for their turn.
func (l *loginLimiter) waiting(source string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sources[source]; s != nil {
		return len(s.waiters)
	}
	return 0
}

func TestLoginLimiter(t *testing.T) {
	ctx := context.Background()

	t.Run("an address over its bound is refused at once, another is not", func(t *testing.T) {
		l := newLoginLimiter(clocktesting.NewFakeClock(time.Now()), 1, 2)
		first := waitFor(t, admitAsync(ctx, l, "10.0.0.1"), "the first login")
		second := admitAsync(ctx, l, "10.0.0.1")
		stillWaiting(t, second, "the second login, while the Kopia server has the first")
		waitUntil(t, func() bool { return l.pending("10.0.0.1") == 2 }, "the second login is held")
		_, err := l.admit(ctx, "10.0.0.1")
		var throttled *throttledError
		if !errors.As(err, &throttled) {
			t.Fatalf("the third login: %v, want it refused", err)
		}
		other := admitAsync(ctx, l, "10.0.0.2")
		first.done(loginAccepted)
		waitFor(t, second, "the second login").done(loginAccepted)
		waitFor(t, other, "another address's login").done(loginAccepted)
	})

	t.Run("a login whose guest went away never reaches the server", func(t *testing.T) {
		l := newLoginLimiter(clocktesting.NewFakeClock(time.Now()), 1, 16)
		first := waitFor(t, admitAsync(ctx, l, "10.0.0.1"), "the first login")
		gone, cancel := context.WithCancel(ctx)
		waiting := admitAsync(gone, l, "10.0.0.2")
		stillWaiting(t, waiting, "a login while the server has another")
		cancel()
		if a := waitFor(t, waiting, "the cancelled login"); !errors.Is(a.err, context.Canceled) {
			t.Fatalf("the cancelled login: %v, want it dropped", a.err)
		}
		next := admitAsync(ctx, l, "10.0.0.3")
		first.done(loginRefused)
		waitFor(t, next, "the next login").done(loginAccepted)
		if len(l.inFlight) != 0 || len(l.sources) != 1 {
			t.Errorf("%d in flight, %d addresses remembered: want 0, and only the failing one", len(l.inFlight), len(l.sources))
		}
	})

	t.Run("after a failure an address has one login at a time, after a backoff", func(t *testing.T) {
		clock := clocktesting.NewFakeClock(time.Now())
		l := newLoginLimiter(clock, 4, 16)
		waitFor(t, admitAsync(ctx, l, "10.0.0.1"), "the first login").done(loginRefused)
		second, third := admitAsync(ctx, l, "10.0.0.1"), admitAsync(ctx, l, "10.0.0.1")
		stillWaiting(t, second, "a login right after a failure")
		for l.waiting("10.0.0.1") != 1 || !clock.HasWaiters() {
			time.Sleep(time.Millisecond) // one has its turn and waits out the backoff
		}
		clock.Step(loginBackoffBase)
		var a admitted
		rest := third
		select {
		case a = <-second:
		case a = <-third:
			rest = second
		case <-time.After(10 * time.Second):
			t.Fatal("no login admitted after the backoff")
		}
		if a.err != nil {
			t.Fatal(a.err)
		}
		stillWaiting(t, rest, "the other login, while the first after the failure is at the server")
		a.done(loginAccepted)
		waitFor(t, rest, "the other login, once a login succeeded").done(loginAccepted)
		if len(l.sources) != 0 {
			t.Errorf("%d addresses remembered after their logins succeeded", len(l.sources))
		}
	})
}

func TestAnAbandonedLoginKeepsItsPlaceForAboutALogin(t *testing.T) {
	ctx := context.Background()
	clock := clocktesting.NewFakeClock(time.Now())
	l := newLoginLimiter(clock, 1, 16)
	first := waitFor(t, admitAsync(ctx, l, "10.0.0.1"), "a login")
	clock.Step(300 * time.Millisecond)
	first.done(loginRefused) // the Kopia server took 300 ms to answer
	abandoned := waitFor(t, admitAsync(ctx, l, "10.0.0.2"), "a login its guest then abandons")
	abandoned.done(loginAbandoned)
	next := admitAsync(ctx, l, "10.0.0.3")
	stillWaiting(t, next, "a login while the server still verifies the abandoned one")
	waitUntil(t, clock.HasWaiters, "the abandoned login's place is timed")
	clock.Step(300 * time.Millisecond)
	waitFor(t, next, "a login once the abandoned one's time is over").done(loginAccepted)
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sources["10.0.0.2"]; s == nil || s.failures != 1 {
		t.Errorf("the abandoning address: %+v, want one failure", s)
	}
}
