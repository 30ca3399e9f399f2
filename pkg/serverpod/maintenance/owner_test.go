package maintenance

import (
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	const ours = "guestbackup-maintenance@store.ns"
	for _, tc := range []struct {
		name, current string
		want          Action
	}{
		{"ours already", ours, ActionKeep},
		{"no owner: a repository created by the library", "", ActionClaim},
		{"a renamed BSLS over the same storage", "guestbackup-maintenance@old.ns", ActionClaim},
		{"an admin's kopia CLI", "root@laptop", ActionLeave},
		{"a look-alike user name", "guestbackup-maintenance-x@store.ns", ActionLeave},
		{"the pod's own host name, as kopia server would write it", "kopia@store-server-5d9f7c-abcde", ActionLeave},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Decide(tc.current, ours); got != tc.want {
				t.Fatalf("Decide(%q) = %s, want %s", tc.current, got, tc.want)
			}
		})
	}
}

func TestOwnerIsFixedPerBSLS(t *testing.T) {
	if got := OwnerName("ns", "store"); got != "guestbackup-maintenance@store.ns" {
		t.Fatalf("OwnerName = %q", got)
	}
}

func TestScheduleDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Schedule
		want Schedule
	}{
		{"unset: Kopia's defaults", Schedule{}, Schedule{Quick: time.Hour, Full: 24 * time.Hour}},
		{"both set", Schedule{Quick: 30 * time.Minute, Full: 12 * time.Hour}, Schedule{Quick: 30 * time.Minute, Full: 12 * time.Hour}},
		{"a negative interval is the default", Schedule{Quick: -time.Minute, Full: 48 * time.Hour}, Schedule{Quick: time.Hour, Full: 48 * time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.withDefaults(); got != tc.want {
				t.Fatalf("withDefaults = %+v, want %+v", got, tc.want)
			}
		})
	}
}
