package testbed

import (
	"testing"
	"time"
)

// deadline is a test's deadline, as go test's -timeout sets it.
type deadline struct {
	at time.Time
	ok bool
}

func (d deadline) Deadline() (time.Time, bool) { return d.at, d.ok }

// TestSuiteTimeout: a suite ends shortly before go test would end its
// binary, whatever -timeout says; without one, after Ginkgo's hour.
func TestSuiteTimeout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		left     time.Duration
		ok       bool
		min, max time.Duration
	}{
		{"make test's 75 minutes", 75 * time.Minute, true, 73*time.Minute + 50*time.Second, 74 * time.Minute},
		{"a short -timeout", 30 * time.Second, true, 26 * time.Second, 27 * time.Second},
		{"no -timeout", 0, false, time.Hour, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SuiteTimeout(deadline{at: time.Now().Add(tc.left), ok: tc.ok})
			if got < tc.min || got > tc.max {
				t.Errorf("suite timeout %v, want between %v and %v", got, tc.min, tc.max)
			}
		})
	}
}
