package activity

import (
	"slices"
	"strings"
)

// Merge is what a server pod writes into an activity ConfigMap that holds
// published when its own scan found mine. The replicas of one server scan
// one repository but hear different guests: a guest's answers and reports
// reach whichever replica its connection did, and a replica writing only
// what it heard would erase what another heard. So:
//
//   - a guest only one side knows is kept as that side has it;
//   - mine's snapshot count stands (its scan was just refreshed), the
//     newer last snapshot and the earlier first one stand;
//   - the newer report stands;
//   - results merge by request: an ended one over one still running, the
//     first ending over any later one (a guest's repeated answer changes
//     nothing, whichever replica it reaches), else the earlier start.
//
// keep drops the results of requests no longer asked (the controller
// recorded them); nil keeps all. Neither map is changed.
func Merge(published, mine map[string]Guest, keep func(user string, r Result) bool) map[string]Guest {
	out := make(map[string]Guest, max(len(published), len(mine)))
	for user, p := range published {
		out[user] = p
	}
	for user, m := range mine {
		p, ok := out[user]
		if !ok {
			out[user] = m
			continue
		}
		g := m
		if p.Last.End.After(m.Last.End) {
			g.Last = p.Last
		}
		if !p.First.IsZero() && (g.First.IsZero() || p.First.Before(g.First)) {
			g.First = p.First
		}
		if p.Report != nil && (g.Report == nil || p.Report.At.After(g.Report.At)) {
			g.Report = p.Report
		}
		g.Results = MergeResults(p.Results, m.Results)
		out[user] = g
	}
	for user, g := range out {
		if keep != nil {
			g.Results = slices.DeleteFunc(slices.Clone(g.Results), func(r Result) bool { return !keep(user, r) })
		}
		if len(g.Results) == 0 {
			g.Results = nil
		}
		if g.Snapshots == 0 && g.Last.ID == "" && g.Report == nil && g.Results == nil {
			delete(out, user) // nothing left on record
			continue
		}
		out[user] = g
	}
	return out
}

// MergeResults merges two records of a guest's results by request, as
// Merge does, sorted by UID. recorded wins a tie: it was there first.
func MergeResults(recorded, other []Result) []Result {
	byUID := make(map[string]Result, len(recorded)+len(other))
	for _, r := range recorded {
		byUID[r.UID] = r
	}
	for _, r := range other {
		if have, ok := byUID[r.UID]; ok {
			r = Supersede(have, r)
		}
		byUID[r.UID] = r
	}
	out := make([]Result, 0, len(byUID))
	for _, r := range byUID {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Result) int { return strings.Compare(a.UID, b.UID) })
	return out
}

// Supersede is what stands of two results to one request, have recorded
// before next: the first ending; else next, started when have did if
// that is earlier, with have's snapshots when it names none (a restore's
// are chosen when it starts, and its ending keeps them), and restored as
// far as either says (progress told to two replicas never goes back).
func Supersede(have, next Result) Result {
	if have.Ended != nil {
		return have
	}
	if have.Started.Before(next.Started) {
		next.Started = have.Started
	}
	if len(next.Snapshots) == 0 {
		next.Snapshots = have.Snapshots
	}
	next.Restored = max(next.Restored, have.Restored)
	return next
}
