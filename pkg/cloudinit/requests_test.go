package cloudinit

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kopia/kopia/repo"

	"github.com/guestbackup/guestbackup/internal/testbed"
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
	// withdrawn are listed by the poll but gone by the answer: deleted
	// in between.
	withdrawn map[string]bool
}

func (d *desk) Pending(user string) ([]userset.Request, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
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
	box.env = append(box.env, "GUESTBACKUP_REQUESTS_ONCE=1", "GUESTBACKUP_REQUESTS_OFF="+filepath.Join(box.root, RequestsOff))
	if out, err := box.run(ConnectScript); err != nil {
		t.Fatalf("connect: %v\n%s", err, out)
	}

	asked := userset.Request{UID: "8c2d0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "before-upgrade",
		Paths: []string{data, other}, Tags: map[string]string{"why": "the upgrade: 2.0 'now'"}, Description: "before\nthe upgrade"}
	d.add(asked)
	if out, err := box.run(RequestsScript); err != nil {
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
	if got := d.got(); len(got) != 3 || !strings.HasPrefix(got[2], refused.UID+" Failed remote requests are turned off in this guest") {
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
	box.env = append(box.env, "GUESTBACKUP_REQUESTS_ONCE=1", "GUESTBACKUP_HOOKS_DIR="+hooks)
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
