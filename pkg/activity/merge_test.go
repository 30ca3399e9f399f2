package activity

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestMerge(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(1_800_000_000+s), 0).UTC() }
	ended := func(s int) *time.Time { e := at(s); return &e }
	running := func(uid string, started int) Result { return Result{UID: uid, Phase: "Running", Started: at(started)} }
	done := func(uid, phase string, started, end int) Result {
		return Result{UID: uid, Phase: phase, Started: at(started), Ended: ended(end)}
	}
	snap := func(id string, end int) Snapshot {
		return Snapshot{ID: id, Path: "/srv", Start: at(end - 1), End: at(end)}
	}
	restored := func(r Result, n int) Result { r.Restored = n; return r }
	report := func(kind string, s int) *Report { return &Report{Kind: kind, At: at(s)} }
	stillAsked := func(_ string, r Result) bool { return r.UID != "gone" }

	tests := []struct {
		name            string
		published, mine map[string]Guest
		keep            func(string, Result) bool
		want            map[string]Guest
	}{{
		name:      "a result only the other replica heard is kept when this one writes its scan",
		published: map[string]Guest{"web@a": {User: "web@a", Snapshots: 1, Last: snap("s1", 10), Results: []Result{done("r1", "Succeeded", 5, 9)}}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Snapshots: 2, Last: snap("s2", 20)}},
		want:      map[string]Guest{"web@a": {User: "web@a", Snapshots: 2, Last: snap("s2", 20), Results: []Result{done("r1", "Succeeded", 5, 9)}}},
	}, {
		name:      "an ending stands over a replica's news that the request is running",
		published: map[string]Guest{"web@a": {User: "web@a", Results: []Result{done("r1", "Failed", 5, 9)}}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{running("r1", 3)}}},
		want:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{done("r1", "Failed", 5, 9)}}},
	}, {
		name:      "an ending replaces the running record and keeps its earlier start",
		published: map[string]Guest{"web@a": {User: "web@a", Results: []Result{running("r1", 3)}}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{done("r1", "Succeeded", 5, 9)}}},
		want:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{done("r1", "Succeeded", 3, 9)}}},
	}, {
		name:      "the first ending recorded stands over a later one",
		published: map[string]Guest{"web@a": {User: "web@a", Results: []Result{done("r1", "Succeeded", 5, 9)}}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{done("r1", "Failed", 5, 12)}}},
		want:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{done("r1", "Succeeded", 5, 9)}}},
	}, {
		name:      "a restore's progress told to either replica never goes back",
		published: map[string]Guest{"web@a": {User: "web@a", Results: []Result{restored(running("r1", 3), 2)}}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{restored(running("r1", 3), 1)}}},
		want:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{restored(running("r1", 3), 2)}}},
	}, {
		name:      "a restore's later progress stands",
		published: map[string]Guest{"web@a": {User: "web@a", Results: []Result{restored(running("r1", 3), 1)}}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{restored(running("r1", 3), 3)}}},
		want:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{restored(running("r1", 3), 3)}}},
	}, {
		name:      "results of both sides, sorted by request; those no longer asked go",
		published: map[string]Guest{"web@a": {User: "web@a", Results: []Result{running("r2", 1), done("gone", "Succeeded", 1, 2)}}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{running("r1", 4)}}},
		keep:      stillAsked,
		want:      map[string]Guest{"web@a": {User: "web@a", Results: []Result{running("r1", 4), running("r2", 1)}}},
	}, {
		name:      "a guest only the other replica heard of is kept, and goes when nothing is left on record",
		published: map[string]Guest{"db@b": {User: "db@b", Report: report("hook-failed", 4)}, "old@b": {User: "old@b", Results: []Result{done("gone", "Failed", 1, 2)}}},
		mine:      map[string]Guest{},
		keep:      stillAsked,
		want:      map[string]Guest{"db@b": {User: "db@b", Report: report("hook-failed", 4)}},
	}, {
		name:      "the newer report, the newer last snapshot and the earlier first one stand",
		published: map[string]Guest{"web@a": {User: "web@a", Snapshots: 3, First: at(1), Last: snap("s3", 30), Report: report("download-failed", 8)}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Snapshots: 2, First: at(2), Last: snap("s2", 20), Report: report("hook-failed", 6)}},
		want:      map[string]Guest{"web@a": {User: "web@a", Snapshots: 2, First: at(1), Last: snap("s3", 30), Report: report("download-failed", 8)}},
	}, {
		name:      "this replica's newer report and last snapshot stand",
		published: map[string]Guest{"web@a": {User: "web@a", Snapshots: 1, Last: snap("s1", 10), Report: report("download-failed", 2)}},
		mine:      map[string]Guest{"web@a": {User: "web@a", Snapshots: 2, First: at(1), Last: snap("s2", 20), Report: report("hook-failed", 6)}},
		want:      map[string]Guest{"web@a": {User: "web@a", Snapshots: 2, First: at(1), Last: snap("s2", 20), Report: report("hook-failed", 6)}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			publishedBefore := Encode(tc.published)
			got := Merge(tc.published, tc.mine, tc.keep)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Merge (-want +got):\n%s", diff)
			}
			if string(Encode(tc.published)) != string(publishedBefore) {
				t.Error("Merge changed what was published")
			}
		})
	}
}
