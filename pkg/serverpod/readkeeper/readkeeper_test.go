package readkeeper_test

import (
	"testing"

	"github.com/kopia/kopia/repo/content"

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

func TestReplaced(t *testing.T) {
	set := func(ids ...string) readkeeper.Contents {
		c := readkeeper.Contents{}
		for _, id := range ids {
			c[mustID(t, id)] = struct{}{}
		}
		return c
	}
	for _, tc := range []struct {
		name          string
		before, after readkeeper.Contents
		want          bool
	}{
		{"nothing known", nil, set("m01"), false},
		{"unchanged", set("m01", "m02"), set("m01", "m02"), false},
		{"only added", set("m01"), set("m01", "m02"), false},
		{"compacted into a new one", set("m01", "m02"), set("m03"), true},
		{"compacted, then more added", set("m01", "m02"), set("m03", "m04", "m05"), true},
		{"one gone", set("m01", "m02"), set("m02"), true},
	} {
		if got := readkeeper.Replaced(tc.before, tc.after); got != tc.want {
			t.Errorf("%s: Replaced = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func mustID(t *testing.T, s string) content.ID {
	t.Helper()
	id, err := content.ParseID(s)
	if err != nil {
		t.Fatalf("content ID %q: %v", s, err)
	}
	return id
}
