package usersync

import (
	"testing"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
)

// A path is restored from the snapshot source that holds it most closely.
func TestSourceOf(t *testing.T) {
	sources := map[string][]manifest.ID{"/": nil, "/srv": nil, "/srv/data": nil, "/srv/database": nil}
	for p, want := range map[string]string{
		"/srv/data":           "/srv/data",
		"/srv/data/a.txt":     "/srv/data",
		"/srv/database.dump":  "/srv",
		"/srv/databaseX/a":    "/srv",
		"/srv":                "/srv",
		"/etc/nginx":          "/",
		"/srv/database/x/y/z": "/srv/database",
	} {
		if got := sourceOf(sources, p); got != want {
			t.Errorf("sourceOf(%q) = %q, want %q", p, got, want)
		}
	}
	if got := sourceOf(map[string][]manifest.ID{"/srv/data": nil}, "/srv"); got != "" {
		t.Errorf("a folder above every source has none, got %q", got)
	}
}

// The latest complete snapshot, or the last one started before a time.
func TestLatest(t *testing.T) {
	at := func(h int) fs.UTCTimestamp {
		return fs.UTCTimestamp(time.Date(2026, 12, 7, h, 0, 0, 0, time.UTC).UnixNano())
	}
	manifests := []*snapshot.Manifest{
		{ID: "k8", StartTime: at(8)},
		{ID: "k10", StartTime: at(10)},
		{ID: "k12", StartTime: at(12), IncompleteReason: "checkpoint"},
		{ID: "k9", StartTime: at(9)},
	}
	before := func(h int) *time.Time { t := at(h).ToTime(); return &t }
	for name, tt := range map[string]struct {
		before *time.Time
		want   string
	}{
		"the latest complete":     {nil, "k10"},
		"the last before a time":  {before(10), "k9"},
		"before a time between":   {before(11), "k10"},
		"none before the first":   {before(8), ""},
		"an incomplete one never": {before(13), "k10"},
	} {
		id := ""
		if m := latest(manifests, tt.before); m != nil {
			id = string(m.ID)
		}
		if id != tt.want {
			t.Errorf("%s: %q, want %q", name, id, tt.want)
		}
	}
}
