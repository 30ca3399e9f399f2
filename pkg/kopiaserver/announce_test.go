package kopiaserver

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestAnnouncements: a refusal is announced once per value, whatever the
// number of reconciles; again when the same mistake is made anew after it
// was mended, and again once the Event announcing it has expired.
func TestAnnouncements(t *testing.T) {
	server := types.NamespacedName{Namespace: "backup", Name: "main"}
	other := types.NamespacedName{Namespace: "backup", Name: "other"}
	web := types.NamespacedName{Namespace: "team-a", Name: "web"}
	db := types.NamespacedName{Namespace: "team-a", Name: "db"}
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	var a announcements[types.NamespacedName]
	for _, step := range []struct {
		name    string
		after   time.Duration
		forget  bool // the server deleted first
		server  types.NamespacedName
		refused map[types.NamespacedName]string
		want    []types.NamespacedName
	}{
		{"a refusal is announced", 0, false, server, map[types.NamespacedName]string{web: "names team-b/old"}, []types.NamespacedName{web}},
		{"a reconcile later: not again", time.Minute, false, server, map[types.NamespacedName]string{web: "names team-b/old"}, nil},
		{"another VM's refusal is its own", 0, false, server, map[types.NamespacedName]string{web: "names team-b/old", db: "names itself"}, []types.NamespacedName{db}},
		{"another server", 0, false, other, map[types.NamespacedName]string{web: "names team-b/old"}, []types.NamespacedName{web}},
		{"a new value is announced", 0, false, server, map[types.NamespacedName]string{web: "names old@team-b", db: "names itself"}, []types.NamespacedName{web}},
		{"mended", 0, false, server, map[types.NamespacedName]string{}, nil},
		{"the same mistake anew is announced again", 0, false, server, map[types.NamespacedName]string{web: "names old@team-b"}, []types.NamespacedName{web}},
		{"just before its Event expires: not again", Reannounce - time.Second, false, server, map[types.NamespacedName]string{web: "names old@team-b"}, nil},
		{"once its Event has expired: again", time.Second, false, server, map[types.NamespacedName]string{web: "names old@team-b"}, []types.NamespacedName{web}},
		{"the other server's, expired too, sorted", 0, false, other, map[types.NamespacedName]string{web: "names team-b/old", db: "names itself"}, []types.NamespacedName{db, web}},
		{"a server deleted and created again: anew", 0, true, server, map[types.NamespacedName]string{web: "names old@team-b"}, []types.NamespacedName{web}},
	} {
		clk.SetTime(clk.Now().Add(step.after))
		if step.forget {
			a.forget(step.server)
		}
		if got := a.news(clk, step.server, step.refused); !slices.Equal(got, step.want) {
			t.Errorf("%s: announced %v, want %v", step.name, got, step.want)
		}
	}
}
