package sessiongate_test

import (
	"context"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
)

// floodSenders is the flood docs/operations.md measures: 64 concurrent
// wrong logins.
const floodSenders = 64

// BenchmarkLoginUnderFlood measures a guest's login through the gate (one
// session, as `kopia repository status` makes) while floodSenders
// concurrent logins with a wrong password come from another address, each
// sent again as soon as it is answered. Its time per op is the guest's
// login under the flood; it reports the login with no flood (unloaded-ms),
// the ratio of the two (x-unloaded; the goal, docs/operations.md "Logins
// nobody should pay for": at most 3), and the first login once the flood
// stopped (after-ms), which waits for every login the flood left with
// Kopia.
func BenchmarkLoginUnderFlood(b *testing.B) {
	testbed.RequireTestBed(b)
	server := testbed.StartKopiaServer(b, testbed.KopiaServerOptions{})
	_, url := serveGate(b, server, sessiongate.Options{})
	const victim = "victim@team-b"
	password := testbed.RandomPassword()
	server.AddUser(b, victim, password)
	config, err := connectClient(context.Background(), url, server.CAPin, b.TempDir(), victim, password)
	if err != nil {
		b.Fatal(err)
	}
	login := func() time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		start := time.Now()
		if err := loginWith(ctx, config, password); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var unloaded []time.Duration
	for range 5 {
		unloaded = append(unloaded, login())
	}
	sort.Slice(unloaded, func(i, j int) bool { return unloaded[i] < unloaded[j] })
	median := unloaded[len(unloaded)/2]

	mallory := newAttacker(url, server.CA.Cert, net.IPv4(127, 0, 0, 2))
	defer mallory.close()
	ctx, stop := context.WithCancel(context.Background())
	flooded := make(chan floodResult, 1)
	// Bounded: at most this many rounds per sender, and stopped below.
	go func() { flooded <- mallory.flood(ctx, victim, floodSenders, 10_000) }()
	time.Sleep(time.Second) // the flood under way

	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		login()
	}
	under := time.Since(start) / time.Duration(b.N)
	b.StopTimer()
	stop()
	res := <-flooded
	after := login()

	b.ReportMetric(float64(median.Microseconds())/1000, "unloaded-ms")
	b.ReportMetric(float64(under)/float64(median), "x-unloaded")
	b.ReportMetric(float64(after.Microseconds())/1000, "after-ms")
	b.Logf("flood: %s", res)
}
