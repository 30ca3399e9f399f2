package cloudinit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kopia/kopia/repo"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/serverpod/activityscan"
	"github.com/guestbackup/guestbackup/pkg/serverpod/clientserver"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// desk is a server pod's requests, as user sync keeps them: the requests
// of each guest, and the answers it took.
type desk struct {
	mu       sync.Mutex
	requests []userset.Request
	answers  []string
	// progress are the restores' progress told, "uid restored".
	progress []string
	// withdrawn are listed by the poll but gone by the answer: deleted
	// in between.
	withdrawn map[string]bool
	// plans are what the restores restore from, by UID, as the server
	// pod chooses them.
	plans map[string][]clientdist.PlanStep
	// changed wakes the held polls (add closes it); polled counts the
	// looks of polls at what is pending.
	changed chan struct{}
	polled  int
	// lose is how many endings to fail to record, as a server whose
	// ConfigMap cannot be written now.
	lose int
}

func (d *desk) Changed(string) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.changed == nil {
		d.changed = make(chan struct{})
	}
	return d.changed
}

func (d *desk) Progress(_ context.Context, user, uid string, restored int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.ContainsFunc(d.requests, func(r userset.Request) bool { return r.User == user && r.UID == uid }) {
		return clientserver.ErrUnknownRequest
	}
	d.progress = append(d.progress, fmt.Sprintf("%s %d", uid, restored))
	return nil
}

func (d *desk) Plan(_ context.Context, _, uid string) ([]clientdist.PlanStep, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.plans[uid], nil
}

func (d *desk) Pending(user string) ([]userset.Request, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.polled++
	var out []userset.Request
	for _, r := range d.requests {
		if r.User == user && !slices.ContainsFunc(d.answers, func(a string) bool {
			return strings.HasPrefix(a, r.UID+" Succeeded") || strings.HasPrefix(a, r.UID+" Failed")
		}) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (d *desk) Result(_ context.Context, user, uid, phase, message string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.requests {
		if r.User == user && r.UID == uid && !d.withdrawn[uid] {
			if phase != "Running" && d.lose > 0 {
				d.lose--
				return errors.New("the activity cannot be recorded now")
			}
			d.answers = append(d.answers, uid+" "+phase+" "+message)
			return nil
		}
	}
	return clientserver.ErrUnknownRequest
}

func (d *desk) add(r userset.Request) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.requests = append(d.requests, r)
	if d.changed != nil {
		close(d.changed)
		d.changed = nil
	}
}

func (d *desk) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.answers)
}

// A running guest carries out the snapshot requests addressed to it: each
// path gets a snapshot under the guest's own identity with the request's
// tag, its tags and description, whatever characters they hold; and while
// its owner's off switch exists, each request fails, saying so.
func TestRequestsScriptTakesTheSnapshotsAskedFor(t *testing.T) {
	tools := testbed.MustTools(t)
	ctx := t.Context()
	srv, password := serverWithWeb(t)
	d := &desk{}
	port := startClientPortWith(t, srv.CA, clientBinaries(t), "web@team-a", password, d)
	client := port.status
	data, other := t.TempDir(), filepath.Join(t.TempDir(), "my notes; $(reboot)")
	for _, dir := range []string{data, other} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "file.txt"), []byte(dir+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Client: &client, RequestPoll: 30 * time.Second}
	box := newSandbox(t, b, tools.Kopia)
	box.env = append(box.env, "GUESTBACKUP_REQUESTS_ONCE=1", "GUESTBACKUP_REQUEST_HOLD=0", "GUESTBACKUP_REQUESTS_OFF="+filepath.Join(box.root, RequestsOff))
	if out, err := box.run(ConnectScript); err != nil {
		t.Fatalf("connect: %v\n%s", err, out)
	}

	asked := userset.Request{UID: "8c2d0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "before-upgrade",
		Paths: []string{data, other}, Tags: map[string]string{"why": "the upgrade: 2.0 'now'"}, Description: "before\nthe upgrade"}
	// The guest's poll finds nothing, and its server holds it: the
	// request listed meanwhile is its answer.
	held := *box
	held.env = append(slices.Clone(box.env), "GUESTBACKUP_REQUEST_HOLD=120")
	ran := make(chan error, 1)
	var out string
	go func() {
		var err error
		out, err = held.run(RequestsScript)
		ran <- err
	}()
	for i := 0; ; i++ {
		d.mu.Lock()
		polled := d.polled
		d.mu.Unlock()
		if polled > 0 {
			break
		}
		if i == 600 {
			t.Fatal("the guest did not poll within a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.add(asked)
	if err := <-ran; err != nil {
		t.Fatalf("requests: %v\n%s", err, out)
	}
	if got, want := d.got(), []string{asked.UID + " Running ", asked.UID + " Succeeded "}; !slices.Equal(got, want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
	r, err := repo.Open(ctx, srv.ConfigFile, srv.RepoPassword, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	taken, err := activityscan.RequestSnapshots(ctx, r, "web@team-a", asked.UID)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, s := range taken {
		paths = append(paths, s.Path)
	}
	if slices.Sort(paths); !slices.Equal(paths, slices.Sorted(slices.Values(asked.Paths))) {
		t.Fatalf("the request's snapshots are of %q, want %q", paths, asked.Paths)
	}
	list, err := testbed.Run(ctx, time.Minute, box.root, box.env, filepath.Join(box.root, KopiaCommand), "snapshot", "list", "--json", other)
	if err != nil {
		t.Fatalf("snapshot list: %v\n%s", err, list)
	}
	var listed []struct {
		Description string            `json:"description"`
		Tags        map[string]string `json:"tags"`
	}
	if err := json.Unmarshal([]byte(list), &listed); err != nil || len(listed) != 1 ||
		listed[0].Description != asked.Description || listed[0].Tags["tag:why"] != asked.Tags["why"] {
		t.Errorf("the snapshot of %s does not carry the request's tags and description: %v\n%s", other, err, list)
	}

	// A request deleted between the poll and its start is not carried out.
	withdrawn := userset.Request{UID: "8c2d0000-0000-4000-8000-000000000009", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "withdrawn", Paths: []string{data}}
	d.mu.Lock()
	d.withdrawn = map[string]bool{withdrawn.UID: true}
	d.mu.Unlock()
	d.add(withdrawn)
	if out, err := box.run(RequestsScript); err != nil {
		t.Fatalf("requests: %v\n%s", err, out)
	}
	if err := r.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if taken, err := activityscan.RequestSnapshots(ctx, r, "web@team-a", withdrawn.UID); err != nil || len(taken) != 0 {
		t.Errorf("a withdrawn request took snapshots: %v %v", taken, err)
	}

	// An ending the server did not hear is told again when the request is
	// listed again, and the request is not carried out twice.
	lost := userset.Request{UID: "8c2d0000-0000-4000-8000-000000000008", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "lost", Paths: []string{data}}
	d.mu.Lock()
	d.lose = 1
	d.mu.Unlock()
	d.add(lost)
	ended := filepath.Join(box.root, StateDir, "requests", "ended", lost.UID)
	for i := range 2 {
		if out, err := box.run(RequestsScript); err != nil {
			t.Fatalf("requests: %v\n%s", err, out)
		}
		if _, err := os.Stat(ended); i == 0 && err != nil {
			t.Fatalf("the ending the server did not hear is not kept: %v", err)
		}
	}
	if got := d.got(); !slices.Equal(got[len(got)-2:], []string{lost.UID + " Running ", lost.UID + " Succeeded "}) {
		t.Errorf("answers %q, want the lost request started once and its ending told again", got)
	}
	if err := r.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if taken, err := activityscan.RequestSnapshots(ctx, r, "web@team-a", lost.UID); err != nil || len(taken) != 1 {
		t.Errorf("the request whose ending was lost took %d snapshots (%v), want 1", len(taken), err)
	}
	if out, err := box.run(RequestsScript); err != nil {
		t.Fatalf("requests: %v\n%s", err, out)
	}
	if kept, _ := filepath.Glob(filepath.Join(box.root, StateDir, "requests", "ended", "*")); len(kept) != 0 {
		t.Errorf("endings the server heard are kept: %v", kept)
	}

	if err := os.WriteFile(filepath.Join(box.root, RequestsOff), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	refused := userset.Request{UID: "8c2d0000-0000-4000-8000-000000000002", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "again", Paths: []string{data}}
	d.add(refused)
	// A guest with neither curl nor wget polls with python3, which
	// cloud-init needs.
	box.env = append(box.env, "PATH="+onlyTools(t, "python3", "basename"))
	if out, err := box.run(RequestsScript); err != nil {
		t.Fatalf("requests: %v\n%s", err, out)
	}
	if got := d.got(); len(got) != 5 || !strings.HasPrefix(got[4], refused.UID+" Failed remote requests are turned off in this guest") {
		t.Fatalf("answers %q, want the request refused by the off switch", got)
	}
	if err := r.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if again, err := activityscan.RequestSnapshots(ctx, r, "web@team-a", refused.UID); err != nil || len(again) != 0 {
		t.Errorf("a refused request took snapshots: %v %v", again, err)
	}
}

// The owner's hooks run around every snapshot, scheduled or requested: a
// pre-snapshot hook that fails aborts it, which the server hears (a report
// for the schedule, the request's failure), and the post-snapshot hooks
// run whatever happened.
func TestHooksRunAroundEverySnapshot(t *testing.T) {
	tools := testbed.MustTools(t)
	srv, password := serverWithWeb(t)
	d := &desk{}
	port := startClientPortWith(t, srv.CA, clientBinaries(t), "web@team-a", password, d)
	client := port.status
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "db.dump"), []byte("rows\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Paths: []string{data}, Client: &client, RequestPoll: 30 * time.Second}
	box := newSandbox(t, b, tools.Kopia)
	hooks := filepath.Join(box.root, HooksDir)
	box.env = append(box.env, "GUESTBACKUP_REQUESTS_ONCE=1", "GUESTBACKUP_REQUEST_HOLD=0", "GUESTBACKUP_HOOKS_DIR="+hooks)
	if out, err := box.run(ConnectScript); err != nil {
		t.Fatalf("connect: %v\n%s", err, out)
	}
	log := filepath.Join(box.root, "hooks.log")
	hook := func(phase, name, body string) {
		t.Helper()
		dir := filepath.Join(hooks, phase+"-snapshot.d")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hook("pre", "10-flush", `echo "pre $GUESTBACKUP_PATHS [$GUESTBACKUP_REQUEST]" >>`+log)
	hook("post", "10-thaw", `echo "post $GUESTBACKUP_PATHS [$GUESTBACKUP_REQUEST]" >>`+log)
	if out, err := box.run(SnapshotScript); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	ran, _ := os.ReadFile(log)
	if want := "pre " + data + " []\npost " + data + " []\n"; string(ran) != want {
		t.Errorf("hooks ran:\n%s\nwant:\n%s", ran, want)
	}

	hook("pre", "20-check", "echo checking; echo 'the database is not ready' >&2; exit 3")
	out, err := box.run(SnapshotScript)
	if err == nil || !strings.Contains(out, "pre-snapshot hook 20-check failed: the database is not ready; no snapshot taken") {
		t.Fatalf("a failing pre-snapshot hook: %v\n%s", err, out)
	}
	if r := port.reports()["web@team-a"]; r.Kind != "hook-failed" || r.Message != "pre-snapshot hook 20-check failed: the database is not ready" {
		t.Errorf("report %+v, want the hook's failure", r)
	}
	ran, _ = os.ReadFile(log)
	if !strings.HasSuffix(string(ran), "pre "+data+" []\npost "+data+" []\n") {
		t.Errorf("after a failing pre-snapshot hook, the post-snapshot hooks must run:\n%s", ran)
	}

	asked := userset.Request{UID: "8c2d0000-0000-4000-8000-000000000003", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "now", Paths: []string{data}}
	d.add(asked)
	if out, err := box.run(RequestsScript); err != nil {
		t.Fatalf("requests: %v\n%s", err, out)
	}
	if got, want := d.got(), []string{asked.UID + " Running ", asked.UID + " Failed pre-snapshot hook 20-check failed: the database is not ready; no snapshot taken"}; !slices.Equal(got, want) {
		t.Errorf("answers %q, want %q", got, want)
	}
	ran, _ = os.ReadFile(log)
	if !strings.HasSuffix(string(ran), "pre "+data+" [now]\npost "+data+" [now]\n") {
		t.Errorf("a request's hooks, naming it:\n%s", ran)
	}
}

// A running guest carries out a restore as its server chose it: each path
// from its snapshot, byte for byte and with its mode, under the target
// folder at its full path; never over something there, never through a
// folder on the way that is a symbolic link; over itself only in place.
func TestRequestsScriptRestoresWhatTheServerChose(t *testing.T) {
	tools := testbed.MustTools(t)
	ctx := t.Context()
	srv, password := serverWithWeb(t)
	d := &desk{plans: map[string][]clientdist.PlanStep{}}
	port := startClientPortWith(t, srv.CA, clientBinaries(t), "web@team-a", password, d)
	client := port.status
	data := filepath.Join(t.TempDir(), "my data; $(reboot)")
	write := func(name, content string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(data, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("a.txt", "first a\n", 0o640)
	write("sub/b.txt", "first b\n", 0o600)
	write("sub/deeper/c.txt", "first c\n", 0o644)
	b := Bootstrap{ServerURL: srv.URL, CA: srv.CA.CertPEM(), Username: "web@team-a", Password: password, Generation: 1, Client: &client, RequestPoll: 30 * time.Second}
	box := newSandbox(t, b, tools.Kopia)
	box.env = append(box.env, "GUESTBACKUP_REQUESTS_ONCE=1", "GUESTBACKUP_REQUEST_HOLD=0")
	if out, err := box.run(ConnectScript); err != nil {
		t.Fatalf("connect: %v\n%s", err, out)
	}
	kopia := filepath.Join(box.root, KopiaCommand)
	if out, err := testbed.Run(ctx, time.Minute, box.root, box.env, kopia, "snapshot", "create", data); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	list, err := testbed.Run(ctx, time.Minute, box.root, box.env, kopia, "snapshot", "list", "--json", data)
	var listed []struct {
		ID string `json:"id"`
	}
	if err != nil || json.Unmarshal([]byte(list), &listed) != nil || len(listed) != 1 {
		t.Fatalf("snapshot list: %v\n%s", err, list)
	}
	id := listed[0].ID
	restore := func(uid, target string, inPlace bool, paths ...string) []string {
		t.Helper()
		r := userset.Request{UID: uid, User: "web@team-a", Kind: userset.RequestRestore, Name: "restore-" + uid[len(uid)-1:], Paths: paths, Source: "web@team-a", Target: target, InPlace: inPlace}
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
		var plan []clientdist.PlanStep
		for _, p := range paths {
			plan = append(plan, clientdist.PlanStep{ID: id, Path: p, Root: data})
		}
		d.mu.Lock()
		d.plans[uid] = plan
		d.mu.Unlock()
		before := len(d.got())
		d.add(r)
		if out, err := box.run(RequestsScript); err != nil {
			t.Fatalf("requests: %v\n%s", err, out)
		}
		return d.got()[before:]
	}
	same := func(restored, original string) {
		t.Helper()
		want, err := os.ReadFile(original)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(restored)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s holds %q (%v), want %q", restored, got, err, want)
		}
		wi, _ := os.Stat(original)
		if gi, err := os.Stat(restored); err != nil || gi.Mode() != wi.Mode() {
			t.Errorf("%s has mode %v (%v), want %v", restored, gi.Mode(), err, wi.Mode())
		}
	}

	restores := filepath.Join(box.root, "restores")
	into := filepath.Join(restores, "first")
	got := restore("9e1f0000-0000-4000-8000-000000000001", into, false, filepath.Join(data, "sub"), filepath.Join(data, "a.txt"))
	if len(got) != 2 || got[0] != "9e1f0000-0000-4000-8000-000000000001 Running " || !strings.HasPrefix(got[1], "9e1f0000-0000-4000-8000-000000000001 Succeeded "+filepath.Join(data, "sub")+": Restored 2 files") {
		t.Fatalf("answers %q, want Running, then Succeeded with what kopia restored", got)
	}
	// How far it got, told between the paths: the ending tells the rest.
	if want := []string{"9e1f0000-0000-4000-8000-000000000001 1"}; !slices.Equal(d.progress, want) {
		t.Errorf("progress told %q, want %q", d.progress, want)
	}
	for _, name := range []string{"a.txt", "sub/b.txt", "sub/deeper/c.txt"} {
		same(into+filepath.Join(data, name), filepath.Join(data, name))
	}

	// Asked again into the same folder, it overwrites nothing.
	write("a.txt", "second a\n", 0o640)
	got = restore("9e1f0000-0000-4000-8000-000000000002", into, false, filepath.Join(data, "a.txt"))
	if len(got) != 2 || !strings.Contains(got[1], " Failed the restore failed in the guest: "+filepath.Join(data, "a.txt")+": "+into+filepath.Join(data, "a.txt")+" exists already") {
		t.Errorf("answers %q, want a failure: the file is there", got)
	}
	if b, _ := os.ReadFile(into + filepath.Join(data, "a.txt")); string(b) != "first a\n" {
		t.Errorf("a restore overwrote what it found: %q", b)
	}

	// A folder on the way that is a symbolic link leads nowhere.
	trap, elsewhere := filepath.Join(restores, "trap"), t.TempDir()
	first := strings.Split(strings.TrimPrefix(data, "/"), "/")[0]
	if err := os.MkdirAll(trap, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(trap, first)); err != nil {
		t.Fatal(err)
	}
	got = restore("9e1f0000-0000-4000-8000-000000000003", trap, false, filepath.Join(data, "sub"))
	if len(got) != 2 || !strings.Contains(got[1], " Failed the restore failed in the guest: "+filepath.Join(data, "sub")+": "+filepath.Join(trap, first)+" is a symbolic link") {
		t.Errorf("answers %q, want a failure: a symbolic link on the way", got)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("a restore wrote through a symbolic link: %v", entries)
	}

	// Nor into a folder others may change: a guest's user who made it, or
	// may write it, could move a link under the restore while it writes.
	for _, tt := range []struct {
		name, uid string
		prepare   func(string) error
	}{
		{"writable by others", "9e1f0000-0000-4000-8000-000000000005", func(dir string) error { return os.Chmod(dir, 0o777) }},
		{"another user's", "9e1f0000-0000-4000-8000-000000000006", func(dir string) error { return os.Chown(dir, 65534, 65534) }},
		{"anyone may write, sticky", "9e1f0000-0000-4000-8000-000000000007", func(dir string) error { return os.Chmod(dir, 0o777|os.ModeSticky) }},
		{"others may write, alone", "9e1f0000-0000-4000-8000-000000000008", func(dir string) error { return os.Chmod(dir, 0o007) }},
	} {
		name := tt.name
		dir := filepath.Join(restores, strings.ReplaceAll(name, " ", "-"))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := tt.prepare(dir); err != nil {
			t.Fatal(err)
		}
		into := filepath.Join(dir, "into")
		if strings.Contains(name, "sticky") || strings.Contains(name, "alone") {
			into = dir // the target itself
		}
		got = restore(tt.uid, into, false, filepath.Join(data, "a.txt"))
		if len(got) != 2 || !strings.Contains(got[1], dir+" may be changed by others than root") {
			t.Errorf("a folder %s: answers %q, want a refusal", name, got)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("a restore wrote into a folder %s: %v", name, entries)
		}
	}

	// In place, never through a link, nor over one.
	linked := filepath.Join(t.TempDir(), "linked")
	if err := os.Symlink(data, linked); err != nil {
		t.Fatal(err)
	}
	got = restore("9e1f0000-0000-4000-8000-000000000009", "/", true, filepath.Join(linked, "a.txt"))
	if len(got) != 2 || !strings.Contains(got[1], linked+" is a symbolic link, which a restore in place does not follow") {
		t.Errorf("in place through a link: answers %q, want a refusal", got)
	}

	// In place, it puts the snapshot's file back over the changed one.
	got = restore("9e1f0000-0000-4000-8000-000000000004", "/", true, filepath.Join(data, "a.txt"))
	if len(got) != 2 || !strings.Contains(got[1], " Succeeded ") {
		t.Fatalf("answers %q, want the restore in place to succeed", got)
	}
	if b, _ := os.ReadFile(filepath.Join(data, "a.txt")); string(b) != "first a\n" {
		t.Errorf("in place, a.txt holds %q, want the snapshot's", b)
	}
}
