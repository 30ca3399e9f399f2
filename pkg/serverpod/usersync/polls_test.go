package usersync

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/guestbackup/guestbackup/pkg/userset"
)

// A shard's requests are decoded once per version of its users Secret:
// every held poll of the shard's guests reads them when a change wakes
// them all; a new version is decoded again.
func TestRequestsCacheDecodesEachVersionOnce(t *testing.T) {
	l := listing(t, nil)
	shard := userset.ShardOf("web@team-a")
	name := userset.SecretName("main", shard)
	put := func(version string, requests ...userset.Request) {
		t.Helper()
		if err := l.stores[name].Update(&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: name, ResourceVersion: version, Labels: map[string]string{userset.Label: "main"}},
			Data:       map[string][]byte{userset.RequestsKey: userset.EncodeRequests(requests)},
		}); err != nil {
			t.Fatal(err)
		}
	}
	one := userset.Request{UID: "5d1e0000-0000-4000-8000-000000000001", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "one", Paths: []string{"/srv"}}
	two := userset.Request{UID: "5d1e0000-0000-4000-8000-000000000002", User: "web@team-a", Kind: userset.RequestSnapshot, Name: "two", Paths: []string{"/srv"}}
	var c requestsCache
	uids := func() []string {
		t.Helper()
		requests, err := c.of(l, "main", shard)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range requests {
			out = append(out, r.Name)
		}
		return out
	}
	put("1", one)
	if got := uids(); len(got) != 1 || got[0] != "one" {
		t.Fatalf("version 1: %v", got)
	}
	put("1", one, two) // the same version cannot hold other data: not decoded again
	if got := uids(); len(got) != 1 {
		t.Errorf("version 1 again: %v, want what was decoded of it", got)
	}
	put("2", one, two)
	if got := uids(); len(got) != 2 {
		t.Errorf("version 2: %v", got)
	}
	if _, err := c.of(nil, "main", shard); err == nil {
		t.Error("no lister yet: want an error")
	}
}
