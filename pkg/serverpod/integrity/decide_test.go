package integrity

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

func TestChoosePacksTakesEveryPackInTurn(t *testing.T) {
	sorted := []blob.ID{"p1", "p2", "p3", "p4"}
	sizes := map[blob.ID]int64{"p1": 10, "p2": 10, "p3": 30, "p4": 10}
	for _, tt := range []struct {
		name       string
		cursor     blob.ID
		budget     int64
		want       []blob.ID
		wantCursor blob.ID
	}{
		{name: "from the start", cursor: "", budget: 20, want: []blob.ID{"p1", "p2"}, wantCursor: "p2"},
		{name: "on from the cursor", cursor: "p2", budget: 20, want: []blob.ID{"p3"}, wantCursor: "p3"},
		{name: "wraps around", cursor: "p3", budget: 20, want: []blob.ID{"p4", "p1"}, wantCursor: "p1"},
		{name: "a cursor between packs", cursor: "p25", budget: 1, want: []blob.ID{"p3"}, wantCursor: "p3"},
		{name: "a pack bigger than the budget is read whole", cursor: "p2", budget: 1, want: []blob.ID{"p3"}, wantCursor: "p3"},
		{name: "never a pack twice", cursor: "p2", budget: 1000, want: []blob.ID{"p3", "p4", "p1", "p2"}, wantCursor: "p2"},
		{name: "no budget reads nothing", cursor: "p2", budget: 0, want: nil, wantCursor: "p2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, cursor := choosePacks(sorted, sizes, tt.cursor, tt.budget)
			if !slices.Equal(got, tt.want) || cursor != tt.wantCursor {
				t.Errorf("choosePacks = %v, %q; want %v, %q", got, cursor, tt.want, tt.wantCursor)
			}
		})
	}
	if got, _ := choosePacks(nil, nil, "", 10); got != nil {
		t.Errorf("no packs: %v", got)
	}
}

func TestBasesAreWhatKopiasNextSnapshotBuildsOn(t *testing.T) {
	m := func(id string, incomplete bool) *snapshot.Manifest {
		s := &snapshot.Manifest{ID: manifest.ID("m" + id)}
		if incomplete {
			s.IncompleteReason = "checkpoint"
		}
		return s
	}
	for _, tt := range []struct {
		name string
		ms   []*snapshot.Manifest
		want []string
	}{
		{name: "the latest complete", ms: []*snapshot.Manifest{m("1", false), m("2", false)}, want: []string{"m2"}},
		{name: "and the incomplete ones after it", ms: []*snapshot.Manifest{m("1", false), m("2", true), m("3", false), m("4", true), m("5", true)}, want: []string{"m3", "m4", "m5"}},
		{name: "every incomplete one when none is complete", ms: []*snapshot.Manifest{m("1", true), m("2", true)}, want: []string{"m1", "m2"}},
		{name: "none", ms: nil, want: nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, b := range bases(tt.ms) {
				got = append(got, string(b.ID))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("bases = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestEventsTellEachChangeOnce(t *testing.T) {
	at := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	damaged := maintenancestate.IntegrityState{
		VerifiedAt: at, LostContents: 4, MissingPacks: []string{"p1"}, DamagedPacks: []string{"p2"},
		DamagedSnapshots: 3, DamagedSince: at,
		Damaged: []maintenancestate.DamagedSource{{User: "web", Host: "team-a", Path: "/srv"}, {User: "web", Host: "team-a", Path: "/etc"}},
	}
	stillDamaged := maintenancestate.IntegrityState{VerifiedAt: at, DamagedSnapshots: 3, DamagedSince: at, Damaged: damaged.Damaged}
	failed := stillDamaged
	failed.Error = "storage does not answer"
	for _, tt := range []struct {
		name      string
		last, now maintenancestate.IntegrityState
		failing   string
		want      []string
	}{
		{name: "intact, as before", want: nil},
		{name: "a loss found", now: damaged, want: []string{"Warning RepositoryDamaged: Verification found 4 contents lost; packs missing from the storage: p1; packs whose contents do not read back: p2. They are dropped from the index, so that the next snapshot of the same data uploads them again; 3 snapshots of 1 guests reference lost data"}},
		{name: "still damaged, nothing new", last: damaged, now: stillDamaged, want: nil},
		{name: "healed", last: stillDamaged, now: maintenancestate.IntegrityState{VerifiedAt: at}, want: []string{"Normal RepositoryIntactAgain: No snapshot references lost data any more: the guests uploaded it again (damaged since 2026-12-06T09:00:00Z)"}},
		{name: "a pass that failed", last: stillDamaged, now: failed, want: []string{"Warning VerificationFailing: Repository verification could not complete, and is tried again at the next pass: storage does not answer; the last complete pass, at 2026-12-06T09:00:00Z, stands"}},
		{name: "failing the same way again", last: failed, now: failed, failing: failed.Error, want: nil},
		{name: "a pass after a failure says nothing of the failure's end", last: failed, now: stillDamaged, want: nil},
		{name: "what could not heal is settled", last: stillDamaged, now: maintenancestate.IntegrityState{VerifiedAt: at, Settled: []maintenancestate.DamagedSource{{User: "web", Host: "team-a", Path: "/srv", Snapshots: 3, Files: 2}}}, want: []string{
			"Warning SnapshotsSettled: 3 damaged snapshots of 1 guests could no longer heal",
			"Normal RepositoryIntactAgain: No snapshot references lost data any more (damaged since",
		}},
		{name: "healed by the pass after a failure", last: failed, now: maintenancestate.IntegrityState{VerifiedAt: at}, want: []string{"Normal RepositoryIntactAgain: "}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, e := range events(tt.last, tt.now, tt.failing) {
				kind := "Normal"
				if e.warning {
					kind = "Warning"
				}
				got = append(got, kind+" "+e.reason+": "+e.message)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("events = %q, want %q", got, tt.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("event %d = %q, want it to start %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestDamagedSinceStaysWhileDamaged(t *testing.T) {
	t0, t1 := time.Unix(100, 0), time.Unix(200, 0)
	damaged := maintenancestate.IntegrityState{DamagedSnapshots: 1}
	if got := damagedSince(maintenancestate.IntegrityState{}, damaged, t1); !got.Equal(t1) {
		t.Errorf("newly damaged: %v", got)
	}
	if got := damagedSince(maintenancestate.IntegrityState{DamagedSince: t0}, damaged, t1); !got.Equal(t0) {
		t.Errorf("still damaged: %v", got)
	}
	if got := damagedSince(maintenancestate.IntegrityState{DamagedSince: t0}, maintenancestate.IntegrityState{}, t1); !got.IsZero() {
		t.Errorf("healed: %v", got)
	}
}

func TestSummaryListsTheMostRecentDamageFirst(t *testing.T) {
	snap := func(id string, sec int64) *snapshot.Manifest {
		return &snapshot.Manifest{ID: manifest.ID("m" + id), StartTime: fs.UTCTimestamp(sec * 1e9)}
	}
	d := &damage{snapshots: 5, sources: []*sourceDamage{
		{src: snapshot.SourceInfo{UserName: "db", Host: "team-a", Path: "/var"}, damaged: []*snapshot.Manifest{snap("1", 10)}, files: map[object.ID]bool{oid(t, "a"): true}},
		{src: snapshot.SourceInfo{UserName: "web", Host: "team-a", Path: "/srv"}, healing: true,
			damaged: []*snapshot.Manifest{snap("2", 20), snap("3", 30), snap("4", 40), snap("5", 50)}, files: map[object.ID]bool{oid(t, "b"): true, oid(t, "c"): true}},
	}}
	n, got := d.summary()
	if n != 5 || len(got) != 2 {
		t.Fatalf("summary = %d, %+v", n, got)
	}
	web := got[0]
	if web.User != "web" || web.Snapshots != 4 || web.Files != 2 || !web.Healing || !slices.Equal(web.IDs, []string{"m5", "m4", "m3"}) ||
		web.Oldest.Unix() != 20 || web.Newest.Unix() != 50 {
		t.Errorf("first: %+v", web)
	}
	if got[1].User != "db" || got[1].Healing {
		t.Errorf("second: %+v", got[1])
	}
	want := d.healing()
	if len(want) != 1 || !slices.Equal(want["web@team-a"].Paths, []string{"/srv"}) {
		t.Errorf("notices: %+v", want)
	}
}

// oid is an object ID made of a content ID ending in tail.
func oid(t *testing.T, tail string) object.ID {
	t.Helper()
	id, err := object.ParseID(strings.Repeat("0", 32-len(tail)) + tail)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
