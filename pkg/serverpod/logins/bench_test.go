package logins

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/guestbackup/guestbackup/pkg/identity"
)

// BenchmarkRemembered measures what a Verifier holds for 10,000 users it
// verified (docs/operations.md, memory of a server pod), and the time of a
// returning guest's verification: one MAC and a map lookup. It reports the
// heap per user (bytes-per-user) and for all of them (MiB-10000-users).
func BenchmarkRemembered(b *testing.B) {
	const users = 10_000
	names := make([]string, users)
	for i := range names {
		names[i] = fmt.Sprintf("vm-%05d@namespace-%03d", i, i%500)
	}
	h := fakeHash("password")
	match := func(identity.Hash, string) bool { return true }
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := New(Options{Match: match})
	for _, u := range names {
		if ok, err := v.Verify(context.Background(), u, h, "password"); !ok || err != nil {
			b.Fatalf("%s: %v %v", u, ok, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := float64(after.HeapAlloc) - float64(before.HeapAlloc)

	i := 0
	for b.Loop() {
		if ok, _ := v.Verify(context.Background(), names[i%users], h, "password"); !ok {
			b.Fatal("a remembered guest refused")
		}
		i++
	}
	runtime.KeepAlive(v)
	b.ReportMetric(held/users, "bytes-per-user")
	b.ReportMetric(held/(1<<20), "MiB-10000-users")
}
