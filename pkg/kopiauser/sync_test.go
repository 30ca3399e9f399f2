package kopiauser

import (
	"context"
	"crypto/rand"
	"fmt"
	"reflect"
	"testing"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// fakeHash is a well-formed hash of no password: sync compares hashes as
// stored and never derives one, so its cost is independent of scrypt's.
func fakeHash(tb testing.TB) identity.Hash {
	tb.Helper()
	v := make([]byte, 64)
	if _, err := rand.Read(v); err != nil {
		tb.Fatal(err)
	}
	return identity.Hash{Version: identity.Scrypt, Value: v}
}

func TestPlan(t *testing.T) {
	a, b, b2 := identity.Hash{Version: identity.Scrypt, Value: []byte("a")}, identity.Hash{Version: identity.Scrypt, Value: []byte("b")}, identity.Hash{Version: identity.Scrypt, Value: []byte("b2")}
	bPBKDF2 := identity.Hash{Version: identity.PBKDF2, Value: []byte("b")}
	tests := []struct {
		name            string
		desired, actual map[string]identity.Hash
		want            []Change
	}{
		{name: "nothing", want: nil},
		{name: "in sync", desired: map[string]identity.Hash{"a@x": a}, actual: map[string]identity.Hash{"a@x": a}, want: nil},
		{
			name:    "add to an empty repository",
			desired: map[string]identity.Hash{"b@x": b, "a@x": a},
			want:    []Change{{OpAdd, "a@x", a}, {OpAdd, "b@x", b}},
		},
		{
			name:    "new password",
			desired: map[string]identity.Hash{"b@x": b2}, actual: map[string]identity.Hash{"b@x": b},
			want: []Change{{OpUpdate, "b@x", b2}},
		},
		{
			name:    "same bytes, other algorithm",
			desired: map[string]identity.Hash{"b@x": bPBKDF2}, actual: map[string]identity.Hash{"b@x": b},
			want: []Change{{OpUpdate, "b@x", bPBKDF2}},
		},
		{
			name:   "every user revoked",
			actual: map[string]identity.Hash{"a@x": a, "b@x": b},
			want:   []Change{{Op: OpDelete, Username: "a@x"}, {Op: OpDelete, Username: "b@x"}},
		},
		{
			name:    "add, change and delete at once",
			desired: map[string]identity.Hash{"b@x": b2, "c@x": a},
			actual:  map[string]identity.Hash{"a@x": a, "b@x": b},
			want:    []Change{{Op: OpDelete, Username: "a@x"}, {OpUpdate, "b@x", b2}, {OpAdd, "c@x", a}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Plan(tt.desired, tt.actual); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Plan =\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
}

func TestSyncAgainstARepository(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewRepository(t)
	a, b, b2, c := fakeHash(t), fakeHash(t), fakeHash(t), fakeHash(t)

	steps := []struct {
		desired map[string]identity.Hash
		changes int
	}{
		{desired: map[string]identity.Hash{"a@ns": a, "b@ns": b}, changes: 2},
		{desired: map[string]identity.Hash{"a@ns": a, "b@ns": b}, changes: 0}, // a resync writes nothing
		{desired: map[string]identity.Hash{"b@ns": b2, "c@ns": c}, changes: 3},
		{desired: map[string]identity.Hash{}, changes: 2},
	}
	for i, step := range steps {
		changes, err := Sync(ctx, r, step.desired)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if len(changes) != step.changes {
			t.Errorf("step %d: %d changes, want %d: %v", i, len(changes), step.changes, changes)
		}
		// A fresh reader sees exactly the desired users.
		got, err := List(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(step.desired) {
			t.Fatalf("step %d: repository has %d users, want %d", i, len(got), len(step.desired))
		}
		for name, want := range step.desired {
			if !reflect.DeepEqual(got[name], want) {
				t.Errorf("step %d: user %s has hash %v, want %v", i, name, got[name], want)
			}
		}
	}
}

func TestSyncRefusesBadInputWhole(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewRepository(t)
	// The valid user sorts first, so it is written before the invalid one fails.
	_, err := Sync(ctx, r, map[string]identity.Hash{"a-good@ns": fakeHash(t), "z-bad@NS": fakeHash(t)})
	if err == nil {
		t.Fatal("sync accepted an invalid user name")
	}
	users, err := List(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 0 {
		t.Fatalf("a failed sync left %d users behind", len(users))
	}
}

// BenchmarkSync10000 is a full resync of 10,000 users into a real repository:
// the first writes every user, the second finds nothing to do. No password is
// hashed either time.
func BenchmarkSync10000(b *testing.B) {
	desired := make(map[string]identity.Hash, 10_000)
	for i := range 10_000 {
		desired[fmt.Sprintf("vm-%05d@ns-%d", i, i%50)] = fakeHash(b)
	}
	ctx := context.Background()
	b.Run("initial", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			r := testbed.NewRepository(b)
			b.StartTimer()
			if changes, err := Sync(ctx, r, desired); err != nil || len(changes) != len(desired) {
				b.Fatalf("sync: %d changes, %v", len(changes), err)
			}
		}
	})
	b.Run("resync", func(b *testing.B) {
		r := testbed.NewRepository(b)
		if _, err := Sync(ctx, r, desired); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if changes, err := Sync(ctx, r, desired); err != nil || len(changes) != 0 {
				b.Fatalf("resync: %d changes, %v", len(changes), err)
			}
		}
	})
}
