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
// 200 MB (BenchmarkOptedInVMs). At 50 the heap grows by half instead: 171
// MB, and a start's peak of 269 MB rather than 380. The price is
// collections twice as often, which a controller that allocates little once
// its caches are filled barely feels (docs/operations.md has the figures).
const GCPercent = 50

// SetGCPercent sets the garbage collector's target to GCPercent, unless
// GOGC is set: an admin who sets it knows their trade-off better.
func SetGCPercent() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(GCPercent)
	}
}
