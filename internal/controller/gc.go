package controller

import (
	"os"
	"runtime/debug"
)

// GCPercent is the controller's GOGC unless its environment sets one.
//
// The controller's memory is its caches: with 10,000 opted-in VMs about
// 100 MiB live. Go's default, 100, lets the heap grow to twice what is
// live before it collects, and the runtime keeps what it freed up to that
// target, so a settled controller's RSS was 1.4–1.9 × its heap in use, over
// 200 MB (BenchmarkOptedInVMs). At 25 the heap grows by a quarter instead:
// 171 MB, and a start's peak of 220 MB rather than 380 at Go's default
// (at 50: 198 and 267). The price is more collections while the caches
// fill: the 10,000-VM restart took 26 s as at 50, its reconcilers 16.5 s
// rather than 13.4; once settled the controller allocates little
// (docs/operations.md has the figures).
const GCPercent = 25

// SetGCPercent sets the garbage collector's target to GCPercent, unless
// GOGC is set: an admin who sets it knows their trade-off better.
func SetGCPercent() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(GCPercent)
	}
}
