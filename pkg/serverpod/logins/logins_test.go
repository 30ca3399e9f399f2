package logins

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/pkg/identity"
)

// fakeHash stands for a stored hash of password: the tests count hashes,
// they need not pay for scrypt.
func fakeHash(password string) identity.Hash {
	return identity.Hash{Version: identity.Scrypt, Value: []byte("salt:" + password)}
}

// counting is a Verifier whose hashes compare fakeHash values, and the
// number of hashes it computed.
func counting(t *testing.T, o Options) (*Verifier, *atomic.Int64) {
	t.Helper()
	var hashes atomic.Int64
	o.Match = func(h identity.Hash, password string) bool {
		hashes.Add(1)
		return string(h.Value) == "salt:"+password
	}
	return New(o), &hashes
}

// A step of a login scenario: who logs in with what against which stored
// hash, what the answer is and how many hashes it costs.
type step struct {
	user, stored, password string
	want                   bool
	hashes                 int64
}

func TestVerify(t *testing.T) {
	for _, tt := range []struct {
		name  string
		steps []step
	}{{
		name: "a returning guest costs no hash",
		steps: []step{
			{"db@team-a", "s3cret", "s3cret", true, 1},
			{"db@team-a", "s3cret", "s3cret", true, 0},
			{"db@team-a", "s3cret", "s3cret", true, 0},
		},
	}, {
		name: "a wrong password for a remembered user costs a hash, is refused, and leaves the entry",
		steps: []step{
			{"db@team-a", "s3cret", "s3cret", true, 1},
			{"db@team-a", "s3cret", "guess", false, 1},
			{"db@team-a", "s3cret", "guess", false, 1},
			{"db@team-a", "s3cret", "s3cret", true, 0},
		},
	}, {
		name: "the old password right after rotation is hashed against the new hash and refused",
		steps: []step{
			{"db@team-a", "old", "old", true, 1},
			{"db@team-a", "new", "old", false, 1},
			{"db@team-a", "new", "new", true, 1},
			{"db@team-a", "new", "new", true, 0},
			{"db@team-a", "new", "old", false, 1},
		},
	}, {
		name: "a rotation back to an earlier password is verified again",
		steps: []step{
			{"db@team-a", "old", "old", true, 1},
			{"db@team-a", "new", "new", true, 1},
			{"db@team-a", "old", "old", true, 1},
		},
	}, {
		name: "another user with the same password and stored hash is verified on its own",
		steps: []step{
			{"db@team-a", "same", "same", true, 1},
			{"web@team-a", "same", "same", true, 1},
			{"web@team-a", "same", "same", true, 0},
			{"db@team-a", "same", "same", true, 0},
		},
	}, {
		name: "a wrong password is never remembered",
		steps: []step{
			{"db@team-a", "s3cret", "guess", false, 1},
			{"db@team-a", "s3cret", "guess", false, 1},
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			v, hashes := counting(t, Options{})
			for i, s := range tt.steps {
				before := hashes.Load()
				got, err := v.Verify(context.Background(), s.user, fakeHash(s.stored), s.password)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if got != s.want || hashes.Load()-before != s.hashes {
					t.Errorf("step %d (%s, stored %q, password %q): matched %v with %d hashes, want %v with %d",
						i, s.user, s.stored, s.password, got, hashes.Load()-before, s.want, s.hashes)
				}
			}
		})
	}
}

// A flood of wrong passwords, for remembered users and unknown ones, adds
// nothing to memory and evicts nothing, even at capacity.
func TestFloodNeitherGrowsNorEvicts(t *testing.T) {
	v, hashes := counting(t, Options{Capacity: 4})
	for i := range 4 {
		user := fmt.Sprintf("vm-%d@team-a", i)
		if ok, _ := v.Verify(context.Background(), user, fakeHash(user), user); !ok {
			t.Fatalf("%s refused", user)
		}
	}
	for i := range 1000 {
		user := fmt.Sprintf("vm-%d@team-a", i%8) // half of them remembered
		if ok, _ := v.Verify(context.Background(), user, fakeHash(user), fmt.Sprint("guess-", i)); ok {
			t.Fatalf("wrong password %d accepted", i)
		}
	}
	if n := v.Remembered(); n != 4 {
		t.Errorf("remembered %d after the flood, want 4", n)
	}
	before := hashes.Load()
	for i := range 4 {
		user := fmt.Sprintf("vm-%d@team-a", i)
		if ok, _ := v.Verify(context.Background(), user, fakeHash(user), user); !ok {
			t.Fatalf("%s refused after the flood", user)
		}
	}
	if n := hashes.Load() - before; n != 0 {
		t.Errorf("the remembered users cost %d hashes after the flood, want 0: the flood evicted them", n)
	}
}

// Memory is bounded by Capacity however many users log in, and Retain
// forgets the users no longer listed.
func TestCapacityAndRetain(t *testing.T) {
	v, hashes := counting(t, Options{Capacity: 3})
	for i := range 10 {
		user := fmt.Sprintf("vm-%d@team-a", i)
		if ok, _ := v.Verify(context.Background(), user, fakeHash(user), user); !ok {
			t.Fatalf("%s refused", user)
		}
	}
	if n := v.Remembered(); n != 3 {
		t.Fatalf("remembered %d, want the capacity 3", n)
	}
	v.Retain(func(string) bool { return false })
	if n := v.Remembered(); n != 0 {
		t.Fatalf("remembered %d after retaining nobody", n)
	}
	before := hashes.Load()
	if ok, _ := v.Verify(context.Background(), "vm-9@team-a", fakeHash("vm-9@team-a"), "vm-9@team-a"); !ok || hashes.Load()-before != 1 {
		t.Errorf("a forgotten user's login: matched %v with %d hashes, want a match with 1", ok, hashes.Load()-before)
	}
}

// An unknown user costs a hash, as a wrong password does, and matches
// nothing.
func TestUnknownCostsAHash(t *testing.T) {
	v, hashes := counting(t, Options{})
	if err := v.Unknown(context.Background(), identity.Scrypt, "anything"); err != nil {
		t.Fatal(err)
	}
	if n := hashes.Load(); n != 1 {
		t.Errorf("an unknown user cost %d hashes, want 1", n)
	}
	if d := decoy(identity.PBKDF2); d.Version != identity.PBKDF2 {
		t.Errorf("the PBKDF2 decoy is of version %s", d.Version)
	}
}

// Hashes run Parallel at once, and a caller that gives up while waiting
// for a slot costs none.
func TestParallel(t *testing.T) {
	release := make(chan struct{})
	var running, most atomic.Int64
	v := New(Options{Parallel: 2, Match: func(identity.Hash, string) bool {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		running.Add(-1)
		return false
	}})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { _, _ = v.Verify(context.Background(), fmt.Sprintf("vm-%d@team-a", i), fakeHash("x"), "y") })
	}
	deadline := time.Now().Add(30 * time.Second)
	for running.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("two verifications did not run at once")
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := v.Verify(ctx, "vm-3@team-a", fakeHash("x"), "y"); !errors.Is(err, context.Canceled) {
		t.Errorf("a third verification with both slots taken and its caller gone: %v, want context.Canceled", err)
	}
	close(release)
	wg.Wait()
	if m := most.Load(); m != 2 {
		t.Errorf("%d hashes ran at once, want 2", m)
	}
}
