package clientdist

import (
	"testing"

	"github.com/guestbackup/guestbackup/pkg/userset"
)

// What a person wrote reaches the guest's shell as base64 only.
func TestEncodeRequests(t *testing.T) {
	got := string(EncodeRequests([]userset.Request{
		{UID: "aaaa0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "before-upgrade",
			Paths: []string{"/srv/my files", "/etc/$(reboot)"}, Tags: map[string]string{"z": "last", "why": "it's; done"}, Description: "line one\nline two"},
		{UID: "bbbb0000-0000-4000-8000-000000000002", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "plain", Paths: []string{"/srv"}},
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
`
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}
