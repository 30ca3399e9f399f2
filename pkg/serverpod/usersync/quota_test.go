package usersync

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestOverQuota(t *testing.T) {
	for _, tc := range []struct {
		name         string
		used, bounds map[string]int64
		want         []string // user used/quota, in order
	}{
		{name: "no quota", used: map[string]int64{"web@a": 10}},
		{name: "under", used: map[string]int64{"web@a": 9}, bounds: map[string]int64{"web@a": 10}},
		{name: "reached is refused", used: map[string]int64{"web@a": 10}, bounds: map[string]int64{"web@a": 10}, want: []string{"web@a"}},
		{name: "a quota of 0 refuses even a VM that stores nothing", bounds: map[string]int64{"web@a": 0}, want: []string{"web@a"}},
		{name: "a user without a quota is never over", used: map[string]int64{"web@a": 1 << 40, "db@a": 5}, bounds: map[string]int64{"db@a": 4}, want: []string{"db@a"}},
		{
			name:   "the most over first, by share of the quota",
			used:   map[string]int64{"a@x": 11, "b@x": 300, "c@x": 30, "d@x": 5},
			bounds: map[string]int64{"a@x": 10, "b@x": 100, "c@x": 10, "d@x": 0},
			want:   []string{"d@x", "b@x", "c@x", "a@x"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, u := range overQuota(tc.used, tc.bounds) {
				got = append(got, u.User)
				if u.UsedBytes != tc.used[u.User] || u.QuotaBytes != tc.bounds[u.User] {
					t.Errorf("%s: %d of %d, want %d of %d", u.User, u.UsedBytes, u.QuotaBytes, tc.used[u.User], tc.bounds[u.User])
				}
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("over = %v, want %v", got, tc.want)
			}
		})
	}
}

// Whose writes the gate refuses follows the quotas and the measurements as
// they change, and a failed measurement keeps the last one in force.
func TestQuotasRefuse(t *testing.T) {
	var q quotas
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	refused := func(user string) bool { return q.refuses(user) != nil }

	q.set(map[string]int64{"web@team-a": 100}, nil, time.Time{}, nil)
	if refused("web@team-a") || q.published() != nil {
		t.Fatal("refused, or said, before any measurement")
	}

	q.set(nil, map[string]int64{"web@team-a": 150, "db@team-a": 1 << 30}, at, nil)
	err := q.refuses("web@team-a")
	var qe *QuotaError
	if !errors.As(err, &qe) || qe.VM != "team-a/web" {
		t.Fatalf("web over its quota: %v", err)
	}
	if want := "VirtualMachine team-a/web stores 150 B, reaching its backup quota of 100 B (measured at 2026-12-06T12:00:00Z)"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("the guest reads %q, want it to start %q", err, want)
	}
	if refused("db@team-a") {
		t.Error("db has no quota, and is refused")
	}
	if s := q.published(); s == nil || s.OverCount != 1 || s.Over[0].User != "web@team-a" || !s.MeasuredAt.Equal(at) {
		t.Errorf("published %+v", s)
	}

	q.set(nil, nil, time.Time{}, errors.New("storage does not answer"))
	if !refused("web@team-a") {
		t.Error("a failed measurement let a VM over its quota write")
	}
	if s := q.published(); s == nil || s.Error != "storage does not answer" || s.OverCount != 1 || !s.MeasuredAt.Equal(at) {
		t.Errorf("published after a failed measurement: %+v, want the last one's, with the failure", s)
	}

	q.set(map[string]int64{"web@team-a": 1 << 20}, nil, time.Time{}, nil)
	if refused("web@team-a") {
		t.Error("a raised quota does not take effect on the last measurement")
	}
	if s := q.published(); s == nil || s.OverCount != 0 || s.Error != "storage does not answer" {
		t.Errorf("published after the raise: %+v", s)
	}

	q.set(map[string]int64{"web@team-a": 100}, nil, time.Time{}, nil)
	q.set(nil, map[string]int64{}, at.Add(time.Minute), nil)
	if refused("web@team-a") {
		t.Error("a VM whose snapshots were all deleted stays refused")
	}

	q.set(map[string]int64{}, nil, time.Time{}, nil)
	if q.published() != nil || q.hasBounds() {
		t.Error("no quota left, still said")
	}
	q.set(map[string]int64{"web@team-a": 0}, nil, time.Time{}, nil)
	if s := q.published(); s == nil || s.OverCount != 1 || !s.MeasuredAt.Equal(at.Add(time.Minute)) {
		t.Errorf("a quota set again, on the last measurement: %+v, want it over, measured then", s)
	}
}
