package activity

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

func TestNewest(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	at := func(i int, path string) Snapshot {
		end := t0.Add(time.Duration(i)*time.Hour + 700*time.Millisecond)
		return Snapshot{ID: fmt.Sprintf("%032x", i), Path: path, Root: "/", Start: end.Add(-time.Minute), End: end, Bytes: 1 << 20, Files: 12}
	}
	var many []Snapshot
	for i := range 14 {
		many = append(many, at(i, "/srv/data"))
	}
	long := strings.Repeat("/deep", 150) // 750 bytes
	tests := []struct {
		name string
		in   []Snapshot
		want []string // paths' indexes as IDs, newest first
	}{
		{name: "none", in: nil, want: nil},
		{name: "newest first, whatever the order read", in: []Snapshot{at(1, "/a"), at(3, "/a"), at(2, "/a")}, want: []string{"3", "2", "1"}},
		{name: "at most the API's bound", in: many, want: []string{"13", "12", "11", "10", "9", "8", "7", "6", "5", "4"}},
		{name: "long paths cost their own guest snapshots, never a gap", in: []Snapshot{at(5, "/a"), at(4, long), at(3, long), at(2, long), at(1, "/b")}, want: []string{"5", "4", "3"}},
		{name: "one path longer than the bound: nothing", in: []Snapshot{at(1, strings.Repeat("x", MaxCatalogueBytes))}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Newest("web@team-a", tt.in)
			var ids []string
			for _, s := range got {
				var i int
				if _, err := fmt.Sscanf(s.ID, "%x", &i); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, fmt.Sprint(i))
				if s.End.Nanosecond() != 0 || s.Start.Nanosecond() != 0 || s.Root != "" {
					t.Errorf("%+v: want whole seconds and no root", s)
				}
			}
			if !slices.Equal(ids, tt.want) {
				t.Errorf("newest %v, want %v", ids, tt.want)
			}
			if line := EncodeCatalogues(map[string][]Snapshot{"web@team-a": got}); len(line) > MaxCatalogueBytes {
				t.Errorf("the catalogue takes %d bytes, more than %d", len(line), MaxCatalogueBytes)
			}
			if len(got) > v1alpha1.MaxRecentSnapshots {
				t.Errorf("%d snapshots, more than the API admits", len(got))
			}
		})
	}
}

// A full catalogue of ordinary snapshots fits in the bound, so that every
// guest that is not hostile lists its ten newest.
func TestNewestKeepsTenOrdinarySnapshots(t *testing.T) {
	var in []Snapshot
	end := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	for i := range v1alpha1.MaxRecentSnapshots {
		in = append(in, Snapshot{ID: fmt.Sprintf("%032x", 1<<60+i), Path: "/var/lib/guestbackup/some/quite/long/path", Start: end, End: end, Bytes: 1 << 40, Files: 1 << 30})
	}
	if got := Newest(strings.Repeat("v", 63)+"@"+strings.Repeat("n", 63), in); len(got) != v1alpha1.MaxRecentSnapshots {
		t.Errorf("%d of %d ordinary snapshots fit", len(got), len(in))
	}
}

func TestCataloguesRoundTrip(t *testing.T) {
	end := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	in := map[string][]Snapshot{
		"web@team-a": {{ID: "k2", Path: "/srv", Start: end, End: end, Bytes: 3, Files: 1}, {ID: "k1", Path: "/etc", Start: end, End: end}},
		"db@team-b":  {{ID: "k9", Path: "/var/lib/db", Start: end, End: end}},
	}
	data := EncodeCatalogues(in)
	if !slices.Equal(data, EncodeCatalogues(in)) {
		t.Error("encoding the same catalogues twice differs")
	}
	out, err := DecodeCatalogues(data)
	if err != nil {
		t.Fatal(err)
	}
	for user, snaps := range in {
		if !slices.EqualFunc(snaps, out[user], func(a, b Snapshot) bool { return a.ID == b.ID && a.Path == b.Path && a.End.Equal(b.End) }) {
			t.Errorf("%s: %+v, want %+v", user, out[user], snaps)
		}
	}
	if _, err := DecodeCatalogues([]byte("{\n")); err == nil || !strings.Contains(err.Error(), "catalogue line 1") {
		t.Errorf("a malformed catalogue: %v", err)
	}
}

// A shard that holds more guests than planned (a tenant may name its VMs
// into one) fits a ConfigMap all the same: each guest keeps its newest
// snapshots, fewer of them, and none loses all.
func TestFitCatalogues(t *testing.T) {
	end := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	catalogues := map[string][]Snapshot{}
	for g := range 700 {
		user := fmt.Sprintf("vm-%04d@team-a", g)
		var snaps []Snapshot
		for i := range v1alpha1.MaxRecentSnapshots {
			snaps = append(snaps, Snapshot{ID: fmt.Sprintf("%016x%016x", g, i), Path: "/var/lib/guestbackup/some/quite/long/path",
				Start: end.Add(-time.Duration(i) * time.Hour), End: end.Add(-time.Duration(i) * time.Hour), Bytes: 1 << 40, Files: 1 << 30})
		}
		catalogues[user] = Newest(user, snaps)
	}
	if whole := EncodeCatalogues(catalogues); len(whole) <= MaxCatalogueShardBytes {
		t.Fatalf("the spec wants a shard over the bound: %d bytes", len(whole))
	}
	data := FitCatalogues(catalogues)
	if len(data) > MaxCatalogueShardBytes {
		t.Errorf("the shard takes %d bytes, more than %d", len(data), MaxCatalogueShardBytes)
	}
	fitted, err := DecodeCatalogues(data)
	if err != nil {
		t.Fatal(err)
	}
	for user, snaps := range catalogues {
		got := fitted[user]
		if len(got) == 0 || got[0].ID != snaps[0].ID {
			t.Fatalf("%s keeps %v, want its newest first", user, got)
		}
	}
	small := map[string][]Snapshot{"web@team-a": catalogues["vm-0000@team-a"]}
	if got, want := FitCatalogues(small), EncodeCatalogues(small); !slices.Equal(got, want) {
		t.Error("a shard within the bound is cut")
	}
}

// The controller reads one guest's catalogue from an index of the data,
// as DecodeCatalogues would have decoded it.
func TestCatalogueIndex(t *testing.T) {
	end := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	in := map[string][]Snapshot{
		"web@team-a": {{ID: "k2", Path: "/srv", Start: end, End: end, Bytes: 3, Files: 1}, {ID: "k1", Path: "/etc", Start: end, End: end}},
		"db@team-b":  {{ID: "k9", Path: "/var/lib/db", Start: end, End: end}},
	}
	x, err := IndexCatalogues(string(EncodeCatalogues(in)))
	if err != nil {
		t.Fatal(err)
	}
	if got := x.Users(); len(got) != 2 {
		t.Errorf("users %v", got)
	}
	for user, want := range in {
		got, err := x.Of(user)
		if err != nil || !slices.EqualFunc(got, want, func(a, b Snapshot) bool { return a.ID == b.ID && a.Path == b.Path && a.End.Equal(b.End) }) {
			t.Errorf("%s: %+v (%v), want %+v", user, got, err, want)
		}
	}
	if got, err := x.Of("nobody@team-a"); got != nil || err != nil {
		t.Errorf("a guest without a catalogue: %v %v", got, err)
	}
	var none *CatalogueIndex
	if got, err := none.Of("web@team-a"); got != nil || err != nil || none.Users() != nil {
		t.Error("no index: want nothing")
	}
	if _, err := IndexCatalogues("{\"user\":\"a\"}\nnot json\n"); err == nil || !strings.Contains(err.Error(), "catalogue line 2") {
		t.Errorf("a malformed catalogue: %v", err)
	}
}
