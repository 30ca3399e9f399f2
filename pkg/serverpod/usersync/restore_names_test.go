package usersync

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"

	"github.com/guestbackup/guestbackup/pkg/userset"
)

// forger writes snapshots as a hostile guest can through its server: any
// directory object it likes, under its own identity.
type forger struct {
	t   *testing.T
	rep repo.Repository
	now fs.UTCTimestamp
}

func newForger(t *testing.T) *forger {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	st, err := filesystem.New(ctx, &filesystem.Options{Path: filepath.Join(dir, "repo")}, true)
	if err != nil {
		t.Fatal(err)
	}
	const password = "forged-repository-password"
	if err := repo.Initialize(ctx, st, &repo.NewRepositoryOptions{}, password); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "repository.config")
	if err := repo.Connect(ctx, config, st, password, &repo.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := repo.Open(ctx, config, password, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rep.Close(context.Background()) })
	return &forger{t: t, rep: rep, now: fs.UTCTimestampFromTime(time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC))}
}

// snapshot saves a snapshot of user's source path whose root folder holds
// srv, a folder of entries; file entries get one small file's content.
func (f *forger) snapshot(user, source string, entries ...*snapshot.DirEntry) string {
	f.t.Helper()
	return f.nested(user, source, nil, entries...)
}

// nested is snapshot with the entries in folders named nest, one in the
// other, below srv.
func (f *forger) nested(user, source string, nest []string, entries ...*snapshot.DirEntry) string {
	f.t.Helper()
	var id manifest.ID
	err := repo.WriteSession(f.t.Context(), f.rep, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
		// write stores data as one object: a directory listing's ID has
		// prefix "k", a file's none.
		write := func(prefix content.IDPrefix, data []byte) (object.ID, error) {
			ow := w.NewObjectWriter(ctx, object.WriterOptions{Prefix: prefix})
			defer ow.Close()
			if _, err := ow.Write(data); err != nil {
				return object.EmptyID, err
			}
			return ow.Result()
		}
		dir := func(entries ...*snapshot.DirEntry) (object.ID, error) {
			data, err := json.Marshal(snapshot.DirManifest{StreamType: "kopia:directory", Entries: entries})
			if err != nil {
				return object.EmptyID, err
			}
			return write("k", data)
		}
		data, err := write("", []byte("forged\n"))
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Type == snapshot.EntryTypeFile {
				e.ObjectID, e.FileSize = data, 7
			}
			e.ModTime, e.Permissions = f.now, 0o644
		}
		inner, err := dir(entries...)
		if err != nil {
			return err
		}
		for i := len(nest) - 1; i >= 0; i-- {
			if inner, err = dir(&snapshot.DirEntry{Name: nest[i], Type: snapshot.EntryTypeDirectory, ObjectID: inner, Permissions: 0o755, ModTime: f.now}); err != nil {
				return err
			}
		}
		root, err := dir(&snapshot.DirEntry{Name: "srv", Type: snapshot.EntryTypeDirectory, ObjectID: inner, Permissions: 0o755, ModTime: f.now})
		if err != nil {
			return err
		}
		name, host, _ := strings.Cut(user, "@")
		id, err = snapshot.SaveSnapshot(ctx, w, &snapshot.Manifest{
			Source:    snapshot.SourceInfo{UserName: name, Host: host, Path: source},
			StartTime: f.now, EndTime: f.now,
			RootEntry: &snapshot.DirEntry{Name: "root", Type: snapshot.EntryTypeDirectory, ObjectID: root, Permissions: 0o755, ModTime: f.now},
		})
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return string(id)
}

// A restore from another VM's snapshots is checked name by name before it
// starts: kopia restore writes each entry where its name leads, so a name
// that climbs would lead it out of its target. A clean tree, and a VM's
// own snapshots, are planned.
func TestRestorePlanRefusesForgedNames(t *testing.T) {
	f := newForger(t)
	file := func(name string) *snapshot.DirEntry {
		return &snapshot.DirEntry{Name: name, Type: snapshot.EntryTypeFile}
	}
	link := func(name string) *snapshot.DirEntry {
		return &snapshot.DirEntry{Name: name, Type: snapshot.EntryTypeSymlink}
	}
	for name, tt := range map[string]struct {
		entries []*snapshot.DirEntry
		want    string
	}{
		"a clean folder":     {entries: []*snapshot.DirEntry{file("a.txt"), file("b.txt")}},
		"a name that climbs": {entries: []*snapshot.DirEntry{file("../../../etc/cron.d/x")}, want: `an entry named "../../../etc/cron.d/x", which is no file name`},
		"a name of two":      {entries: []*snapshot.DirEntry{file("etc/passwd")}, want: `an entry named "etc/passwd"`},
		"the parent":         {entries: []*snapshot.DirEntry{file("..")}, want: `an entry named ".."`},
		"a name with a NUL":  {entries: []*snapshot.DirEntry{link("ok"), file("a\x00b")}, want: `an entry named "a\x00b"`},
	} {
		t.Run(name, func(t *testing.T) {
			source := "/data/" + strings.ReplaceAll(name, " ", "-")
			f.snapshot("old@team-a", source, tt.entries...)
			granted := userset.Request{UID: "aa", User: "new@team-a", Kind: userset.RequestRestore, Name: "r", Paths: []string{source + "/srv"}, Source: "old@team-a", Target: "/var/lib/guestbackup/restores/r"}
			plan, why, err := restorePlan(t.Context(), f.rep, granted)
			switch {
			case err != nil:
				t.Fatal(err)
			case tt.want == "" && (why != "" || len(plan) != 1):
				t.Errorf("a clean folder refused: %q", why)
			case tt.want != "" && !strings.Contains(string(why), tt.want):
				t.Errorf("refusal %q, want it to contain %q", why, tt.want)
			}
			own := granted
			own.User = "old@team-a"
			if plan, why, err := restorePlan(t.Context(), f.rep, own); err != nil || why != "" || len(plan) != 1 {
				t.Errorf("a VM's own snapshot: %v %q %v", plan, why, err)
			}
		})
	}
}

// Nor does a forged tree deeper than any file system's paths reach kopia
// restore, nor cost the server more than one folder at a time.
func TestRestorePlanRefusesForgedDepth(t *testing.T) {
	f := newForger(t)
	nest := make([]string, 40)
	for i := range nest {
		nest[i] = strings.Repeat(string(rune('a'+i%26)), 200)
	}
	f.nested("old@team-a", "/deep", nest, &snapshot.DirEntry{Name: "x", Type: snapshot.EntryTypeFile})
	r := userset.Request{UID: "aa", User: "new@team-a", Kind: userset.RequestRestore, Name: "r", Paths: []string{"/deep/srv"}, Source: "old@team-a", Target: "/var/lib/guestbackup/restores/r"}
	_, why, err := restorePlan(t.Context(), f.rep, r)
	if err != nil || !strings.Contains(string(why), "a path longer than 4096 bytes, which no file system holds") {
		t.Errorf("refusal %q, %v; want the path's length refused", why, err)
	}
}
