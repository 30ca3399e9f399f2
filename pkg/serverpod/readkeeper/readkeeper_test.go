package readkeeper_test

import (
	"testing"

	"github.com/guestbackup/guestbackup/pkg/serverpod/readkeeper"
)

func TestDue(t *testing.T) {
	for _, tc := range []struct {
		count int
		want  bool
	}{
		{0, false},
		{1, false},
		{readkeeper.Threshold - 1, false},
		{readkeeper.Threshold, true},
		{readkeeper.KopiaThreshold, true},
		{100, true},
	} {
		if got := readkeeper.Due(tc.count); got != tc.want {
			t.Errorf("Due(%d) = %v, want %v", tc.count, got, tc.want)
		}
	}
	// The Keeper must act before Kopia's own compaction needs to write.
	if readkeeper.Threshold >= readkeeper.KopiaThreshold {
		t.Errorf("Threshold %d is not below Kopia's %d", readkeeper.Threshold, readkeeper.KopiaThreshold)
	}
}
