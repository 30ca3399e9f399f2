package testbed

import "testing"

// UnitMode reports whether the tests run as `make unit` runs them
// (`go test -short`): only what needs no tool of the test bed. Outside a test
// binary (the demo links this package) it is false.
func UnitMode() bool {
	return testing.Testing() && testing.Short()
}

// skipper is the part of testing.TB (and GinkgoT()) that skips a test.
type skipper interface {
	Skip(args ...any)
}

// RequireTestBed skips the test in unit mode: it needs a tool of the test bed
// (an API server, Kopia, a guest...), which `make unit` neither builds nor
// expects. Every harness function that needs a tool calls it before looking
// for one, so a test needs no annotation of its own; a test that runs a tool
// outside the harness calls it first. Under `make test` it does nothing, and
// a missing tool fails the test as before.
func RequireTestBed(tb TB) {
	tb.Helper()
	if !UnitMode() {
		return
	}
	const why = "needs the test bed's tools, which go test -short (make unit) leaves out: run make test"
	if s, ok := tb.(skipper); ok {
		s.Skip(why)
		return
	}
	// A TB that cannot skip must not pass for a test that ran.
	tb.Fatalf("%s (and a %T cannot skip)", why, tb)
}
