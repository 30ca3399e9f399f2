package clientdist

import (
	"encoding/base64"
	"reflect"
	"testing"

	"github.com/guestbackup/guestbackup/pkg/userset"
)

// What a person wrote reaches the guest's shell as base64 only.
func TestEncodeRequests(t *testing.T) {
	got := string(EncodeRequests([]userset.Request{
		{UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "before-upgrade",
			Paths: []string{"/srv/my files", "/etc/$(reboot)"}, Tags: map[string]string{"z": "last", "why": "it's; done"}, Description: "line one\nline two"},
		{UID: "bbbb0000-0000-4000-8000-000000000002", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "plain", Paths: []string{"/srv"}},
		{UID: "cccc0000-0000-4000-8000-000000000003", User: "web@team-a", Kind: userset.RequestRestore, Name: "back", Paths: []string{"/etc"}, Source: "web@team-a", Target: "/", InPlace: true},
	}))
	want := `request aaaa0000-0000-4000-8000-000000000001 snapshot before-upgrade
path L3Nydi9teSBmaWxlcw==
path L2V0Yy8kKHJlYm9vdCk=
tag d2h5Oml0J3M7IGRvbmU=
tag ejpsYXN0
description bGluZSBvbmUKbGluZSB0d28=
end
request bbbb0000-0000-4000-8000-000000000002 snapshot plain
path L3Nydg==
end
request cccc0000-0000-4000-8000-000000000003 restore back
path L2V0Yw==
target Lw==
in-place
end
`
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// A restore's plan names, for each path, the source `kopia restore` takes:
// the snapshot alone for its root, else the snapshot and the path below
// its root.
func TestEncodePlan(t *testing.T) {
	plan := []PlanStep{
		{ID: "k1", Path: "/srv", Root: "/srv"},
		{ID: "k1", Path: "/srv/my notes/a.txt", Root: "/srv"},
		{ID: "k2", Path: "/etc/nginx", Root: "/"},
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	want := "from " + b64("k1") + " " + b64("/srv") + "\n" +
		"from " + b64("k1/my notes/a.txt") + " " + b64("/srv/my notes/a.txt") + "\n" +
		"from " + b64("k2/etc/nginx") + " " + b64("/etc/nginx") + "\n"
	if got := string(EncodePlan(plan)); got != want {
		t.Errorf("EncodePlan:\n%s\nwant\n%s", got, want)
	}
}

// A client that is not a shell reads back what EncodeRequests and
// EncodePlan wrote, and refuses what was cut or is no base64.
func TestDecodeRequestsAndPlan(t *testing.T) {
	requests := []userset.Request{
		{UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: userset.RequestRestore, Name: "to-claim", Paths: []string{"/srv/my files", "/etc"},
			Source: "web@team-a", Target: "/to-claim", Job: true},
		{UID: "bbbb0000-0000-4000-8000-000000000002", User: "web@team-a", Kind: userset.RequestRestore, Name: "back", Paths: []string{"/etc"}, Source: "web@team-a", Target: "/", InPlace: true},
	}
	got, err := DecodeRequests(EncodeRequests(requests))
	if err != nil {
		t.Fatal(err)
	}
	want := []Polled{
		{UID: requests[0].UID, Kind: "restore", Name: "to-claim", Paths: []string{"/srv/my files", "/etc"}, Target: "/to-claim"},
		{UID: requests[1].UID, Kind: "restore", Name: "back", Paths: []string{"/etc"}, Target: "/", InPlace: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded %+v, want %+v", got, want)
	}
	plan, err := DecodePlan(EncodePlan([]PlanStep{{ID: "k1", Root: "/srv", Path: "/srv/my files"}, {ID: "k2", Root: "/etc", Path: "/etc"}}))
	if err != nil {
		t.Fatal(err)
	}
	if want := []Planned{{Source: "k1/my files", Path: "/srv/my files"}, {Source: "k2", Path: "/etc"}}; !reflect.DeepEqual(plan, want) {
		t.Errorf("plan %+v, want %+v", plan, want)
	}
	for name, data := range map[string]string{
		"cut":              "request aaaa0000-0000-4000-8000-000000000001 restore a\npath L3Nydg==\n",
		"a path no base64": "request aaaa0000-0000-4000-8000-000000000001 restore a\npath /srv/x\nend\n",
		"a path alone":     "path L3Nydg==\n",
	} {
		if _, err := DecodeRequests([]byte(data)); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := DecodePlan([]byte("from k1\n")); err == nil {
		t.Error("a from line without a path: decoded")
	}
}
