package userset

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
)

func request(uid, user string, paths ...string) Request {
	return Request{UID: uid, User: user, Kind: RequestSnapshot, Name: "r-" + uid[:4], Paths: paths}
}

func TestRequestsRoundTrip(t *testing.T) {
	in := []Request{
		request("bbbb0000-0000-4000-8000-000000000002", "web@team-a", "/srv"),
		{UID: "aaaa0000-0000-4000-8000-000000000001", User: "db@team-a", Kind: RequestSnapshot, Name: "before-upgrade", Paths: []string{"/var/lib/db", "/etc"}, Tags: map[string]string{"why": "upgrade: 2.0"}, Description: "before the upgrade"},
	}
	data := EncodeRequests(in)
	if !strings.HasPrefix(string(data), `{"uid":"aaaa`) {
		t.Errorf("not sorted by UID:\n%s", data)
	}
	out, err := DecodeRequests(data)
	if err != nil {
		t.Fatal(err)
	}
	if string(EncodeRequests(out)) != string(data) {
		t.Errorf("round trip changed the requests:\n%s\nwant\n%s", EncodeRequests(out), data)
	}
}

func TestDecodeRequestsRefuses(t *testing.T) {
	for name, tt := range map[string]struct{ line, want string }{
		"not JSON":                       {`uid web`, "requests line 1: invalid character"},
		"not a UID":                      {`{"uid":"../x","user":"web@team-a","kind":"snapshot","name":"a","paths":["/srv"]}`, `request UID "../x" is not a UID`},
		"not an identity":                {`{"uid":"aa","user":"Web","kind":"snapshot","name":"a","paths":["/srv"]}`, "request aa:"},
		"unknown kind":                   {`{"uid":"aa","user":"web@team-a","kind":"delete","name":"a","paths":["/srv"]}`, `kind "delete" is none of [snapshot restore]`},
		"restore without a source":       {`{"uid":"aa","user":"web@team-a","kind":"restore","name":"a","paths":["/srv"],"target":"/var/lib/guestbackup/restores/a"}`, "restore source:"},
		"restore into a relative folder": {`{"uid":"aa","user":"web@team-a","kind":"restore","name":"a","paths":["/srv"],"source":"web@team-a","target":"restores"}`, `target "restores" is not a clean absolute path`},
		"restore over / not in place":    {`{"uid":"aa","user":"web@team-a","kind":"restore","name":"a","paths":["/srv"],"source":"web@team-a","target":"/"}`, "only a restore in place writes over the guest's own paths"},
		"in place elsewhere":             {`{"uid":"aa","user":"web@team-a","kind":"restore","name":"a","paths":["/srv"],"source":"web@team-a","target":"/tmp","inPlace":true}`, "only a restore in place"},
		"ID and time":                    {`{"uid":"aa","user":"web@team-a","kind":"restore","name":"a","paths":["/srv"],"source":"web@team-a","target":"/tmp","snapshotID":"k1","before":"2026-12-01T00:00:00Z"}`, "by ID and by time at once"},
		"ID that climbs":                 {`{"uid":"aa","user":"web@team-a","kind":"restore","name":"a","paths":["/srv"],"source":"web@team-a","target":"/tmp","snapshotID":"../k1"}`, "is not a snapshot ID"},
		"snapshot with a target":         {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":["/srv"],"target":"/tmp"}`, "a snapshot request carries restore fields"},
		"a Job's in place":               {`{"uid":"aa","user":"web@team-a","kind":"restore","name":"a","paths":["/srv"],"source":"web@team-a","target":"/","inPlace":true,"job":true}`, "a restore into a claim writes into a folder of its own"},
		"a Job's snapshot":               {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":["/srv"],"job":true}`, "a snapshot request carries restore fields"},
		"name with a space":              {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a b","paths":["/srv"]}`, `name "a b" is not an object name`},
		"no path":                        {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":[]}`, "names no path"},
		"relative path":                  {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":["srv"]}`, `path "srv" is not a clean absolute path`},
		"climbing path":                  {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":["/srv/../etc"]}`, "is not a clean absolute path"},
		"newline in a path":              {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":["/srv\nx"]}`, "is not a clean absolute path"},
		"the request tag":                {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":["/srv"],"tags":{"guestbackup-request":"bb"}}`, `tag "guestbackup-request" is not a tag a request may set`},
		"twice":                          {`{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":["/srv"]}` + "\n" + `{"uid":"aa","user":"web@team-a","kind":"snapshot","name":"a","paths":["/srv"]}`, "requests line 2: request aa listed twice"},
	} {
		_, err := DecodeRequests([]byte(tt.line + "\n"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, tt.want)
		}
	}
}

// Dispatch lists the oldest MaxRequestsPerUser requests of each user in
// the user's shard; a flood to one VM waits its turn and delays no other.
func TestDispatch(t *testing.T) {
	var queued []Queued
	for i := range MaxRequestsPerUser + 3 {
		queued = append(queued, Queued{Request: request(fmt.Sprintf("aaaa0000-0000-4000-8000-%012d", i), "web@team-a", "/srv"), Order: fmt.Sprintf("2026-12-07T08:00:%02dZ", 59-i)})
	}
	queued = append(queued, Queued{Request: request("cccc0000-0000-4000-8000-000000000000", "db@team-a", "/var"), Order: "2026-12-07T09:00:00Z"})
	shards := Dispatch(queued)
	web, db := shards[ShardOf("web@team-a")], shards[ShardOf("db@team-a")]
	if ShardOf("web@team-a") == ShardOf("db@team-a") {
		t.Fatal("the spec wants two shards")
	}
	if len(web) != MaxRequestsPerUser {
		t.Fatalf("web's shard lists %d requests, want %d", len(web), MaxRequestsPerUser)
	}
	for _, r := range web {
		var i int
		fmt.Sscanf(r.UID[len(r.UID)-12:], "%d", &i)
		if i < 3 {
			t.Errorf("request %d is listed, but it is among the newest (the oldest wait no longer)", i)
		}
	}
	if len(db) != 1 || db[0].User != "db@team-a" {
		t.Errorf("db's shard lists %v", db)
	}
}

// However many VMs of one shard are asked for large requests, their users
// Secret stays writable: beyond MaxShardRequestsBytes the newest wait.
func TestDispatchKeepsAShardWritable(t *testing.T) {
	long := "/" + strings.Repeat("p", 4000)
	var queued []Queued
	shard := ShardOf("vm-0@team-a")
	for i := 0; len(queued) < 200; i++ {
		user := fmt.Sprintf("vm-%d@team-a", i)
		if ShardOf(user) != shard {
			continue
		}
		r := request(fmt.Sprintf("dddd0000-0000-4000-8000-%012d", len(queued)), user, long, long+"/a", long+"/b")
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
		queued = append(queued, Queued{Request: r, Order: fmt.Sprintf("2026-12-07T08:%02d:%02dZ", len(queued)/60, len(queued)%60)})
	}
	listed := Dispatch(queued)[shard]
	if size := len(EncodeRequests(listed)); size > MaxShardRequestsBytes {
		t.Errorf("the shard lists %d bytes of requests, more than %d", size, MaxShardRequestsBytes)
	}
	if len(listed) == 0 || listed[0].UID != queued[0].UID {
		t.Errorf("the oldest request must be listed first; listed %d", len(listed))
	}
	if len(listed) == len(queued) {
		t.Error("every request listed: the budget bounds nothing")
	}
}

// RestoreRequest carries a GuestRestore to its VM's guest: the target
// folder is spelled out, the source is an identity, and what a running
// guest cannot carry, or a grant gone since admission, fails with what to
// do.
func TestRestoreRequest(t *testing.T) {
	before := metav1.NewTime(time.Date(2026, 12, 6, 18, 0, 0, 0, time.FixedZone("CET", 3600)))
	restore := func(change func(*v1alpha1.GuestRestoreSpec)) *v1alpha1.GuestRestore {
		g := &v1alpha1.GuestRestore{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "nginx-config", UID: types.UID("aaaa0000-0000-4000-8000-000000000001")},
			Spec: v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/nginx/", "/srv/a.txt"}}}
		change(&g.Spec)
		return g
	}
	granted := map[string]string{v1alpha1.AnnotationRestoreFrom: "old"}
	for name, tt := range map[string]struct {
		g       *v1alpha1.GuestRestore
		vm      map[string]string
		want    Request
		wantErr string
	}{
		"the latest, into the default folder": {g: restore(func(*v1alpha1.GuestRestoreSpec) {}), want: Request{
			UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "nginx-config",
			Paths: []string{"/etc/nginx", "/srv/a.txt"}, Source: "web@team-a", Target: "/var/lib/guestbackup/restores/nginx-config"}},
		"by ID, into a folder": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Snapshot.ID = "k0123abc"; s.Target.Directory = "/srv/back/" }), want: Request{
			UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "nginx-config",
			Paths: []string{"/etc/nginx", "/srv/a.txt"}, Source: "web@team-a", SnapshotID: "k0123abc", Target: "/srv/back"}},
		"before a time, in place": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Snapshot.Before = &before; s.Target.InPlace = true }), want: Request{
			UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "nginx-config",
			Paths: []string{"/etc/nginx", "/srv/a.txt"}, Source: "web@team-a", Before: ptr(time.Date(2026, 12, 6, 17, 0, 0, 0, time.UTC)), Target: "/", InPlace: true}},
		"another VM's, granted": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old" }), vm: granted, want: Request{
			UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "nginx-config",
			Paths: []string{"/etc/nginx", "/srv/a.txt"}, Source: "old@team-a", Target: "/var/lib/guestbackup/restores/nginx-config"}},
		"the VM itself as its source": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "web" }), want: Request{
			UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "nginx-config",
			Paths: []string{"/etc/nginx", "/srv/a.txt"}, Source: "web@team-a", Target: "/var/lib/guestbackup/restores/nginx-config"}},
		"another VM's, the grant gone": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old" }),
			wantErr: "VirtualMachine web may no longer read the snapshots of old: annotate it with guestbackup.io/restore-from=old"},
		"another VM's, another granted": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "older" }), vm: granted,
			wantErr: "may no longer read the snapshots of older"},
		"a path within another": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Paths = []string{"/srv/x", "/srv"} }),
			wantErr: "path /srv/x lies within /srv, which the restore writes already: name one of them"},
		"into a claim": {g: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "data"}
		}), want: Request{
			UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "nginx-config",
			Paths: []string{"/etc/nginx", "/srv/a.txt"}, Source: "web@team-a", Target: "/nginx-config", Job: true}},
		"a dry run": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.DryRun = true }), want: Request{
			UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "nginx-config",
			Paths: []string{"/etc/nginx", "/srv/a.txt"}, Source: "web@team-a", Target: "/var/lib/guestbackup/restores/nginx-config", DryRun: true}},
		"a history of one path": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.DryRun, s.History, s.Paths = true, true, []string{"/srv/a.txt"} }), want: Request{
			UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "nginx-config",
			Paths: []string{"/srv/a.txt"}, Source: "web@team-a", Target: "/var/lib/guestbackup/restores/nginx-config", DryRun: true, History: true}},
		"a history of two paths (admission refuses it)": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.DryRun, s.History = true, true }),
			wantErr: "a history lists one path's versions across snapshots"},
		"a history that is no dry run (admission refuses it)": {g: restore(func(s *v1alpha1.GuestRestoreSpec) { s.History, s.Paths = true, []string{"/srv/a.txt"} }),
			wantErr: "a history lists one path's versions across snapshots"},
	} {
		got, err := RestoreRequest(tt.g, tt.vm)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %v, want an error containing %q", name, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", name, err)
		case string(EncodeRequests([]Request{got})) != string(EncodeRequests([]Request{tt.want})):
			t.Errorf("%s:\n%s\nwant\n%s", name, EncodeRequests([]Request{got}), EncodeRequests([]Request{tt.want}))
		}
	}
}

func ptr[T any](v T) *T { return &v }

// What the listed requests' results will record in their shard's activity
// ConfigMap is within the shard's budget too: a tenant's restores of many
// short paths, answered Running and never ended, cannot make the ConfigMap
// too large to write for every guest of the shard.
func TestDispatchBoundsTheResults(t *testing.T) {
	paths := make([]string, 64)
	for i := range paths {
		paths[i] = fmt.Sprintf("/%c", 'a'+i%26)
		if i >= 26 {
			paths[i] = fmt.Sprintf("/%c%d", 'a'+i%26, i)
		}
	}
	var queued []Queued
	shard := ShardOf("vm-0@team-a")
	for i := 0; len(queued) < 1000; i++ {
		user := fmt.Sprintf("vm-%d@team-a", i)
		if ShardOf(user) != shard {
			continue
		}
		r := Request{UID: fmt.Sprintf("eeee0000-0000-4000-8000-%012d", len(queued)), User: user, Kind: RequestRestore, Name: "r", Paths: paths, Source: user, Target: "/var/lib/guestbackup/restores/r"}
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
		queued = append(queued, Queued{Request: r, Order: fmt.Sprint(len(queued))})
	}
	listed := Dispatch(queued)[shard]
	guests := map[string]activity.Guest{}
	at := time.Date(2026, 12, 7, 8, 0, 0, 123456789, time.UTC)
	for _, r := range listed {
		g := guests[r.User]
		g.User = r.User
		res := activity.Result{UID: r.UID, Phase: "Running", Started: at}
		for _, p := range r.Paths {
			res.Snapshots = append(res.Snapshots, activity.Snapshot{ID: strings.Repeat("f", 32), Path: p, Root: p, Start: at, End: at, Bytes: 1 << 40, Files: 1 << 30})
		}
		g.Results = append(g.Results, res)
		guests[r.User] = g
	}
	if size := len(activity.Encode(guests)); len(listed) == 0 || size > MaxShardRequestsBytes {
		t.Errorf("%d listed restores record %d bytes of results in their shard's activity, more than %d", len(listed), size, MaxShardRequestsBytes)
	}
}

// However a request is made within its bounds, its budget leaves room in
// its shard, so that the oldest request of a shard is always listed; a VM
// annotation naming more paths than a request may is refused, not listed.
func TestOneRequestAlwaysFitsItsShard(t *testing.T) {
	paths := make([]string, MaxRequestPaths)
	for i := range paths {
		paths[i] = fmt.Sprintf("/%03d%s", i, strings.Repeat("p", 200))
	}
	r := Request{UID: "ffff0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: RequestRestore, Name: "largest", Paths: paths, Source: "web@team-a", Target: "/var/lib/guestbackup/restores/largest", DryRun: true}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if r.budget() > MaxShardRequestsBytes/2 {
		t.Errorf("the largest request's budget is %d bytes, more than half a shard's %d", r.budget(), MaxShardRequestsBytes)
	}
	many := make([]string, 2900)
	for i := range many {
		many[i] = fmt.Sprintf("/a%d", i)
	}
	s := &v1alpha1.GuestSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "many", UID: "ffff0000-0000-4000-8000-000000000002"}, Spec: v1alpha1.GuestSnapshotSpec{VM: "web"}}
	if _, err := SnapshotRequest(s, many); err == nil || !strings.Contains(err.Error(), "names 2900 paths, more than 64") {
		t.Errorf("a request of 2900 paths: %v", err)
	}
	if listed := Dispatch([]Queued{{Request: r, Order: "1"}})[ShardOf(r.User)]; len(listed) != 1 {
		t.Errorf("the largest request alone is not listed: %v", listed)
	}
}

// A Job's requests go under a key of their own, which a server pod that
// knows no Job never reads.
func TestSplitJobs(t *testing.T) {
	guest := request("aaaa0000-0000-4000-8000-000000000001", "web@team-a", "/srv")
	job := Request{UID: "bbbb0000-0000-4000-8000-000000000002", User: "web@team-a", Kind: RequestRestore, Name: "to-claim", Paths: []string{"/srv"}, Source: "web@team-a", Target: ClaimFolder("to-claim"), Job: true}
	guests, jobs := SplitJobs([]Request{job, guest})
	if len(guests) != 1 || guests[0].UID != guest.UID || len(jobs) != 1 || jobs[0].UID != job.UID {
		t.Errorf("guests %v, jobs %v", guests, jobs)
	}
}
