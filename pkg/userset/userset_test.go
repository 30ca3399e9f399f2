package userset

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/guestbackup/guestbackup/pkg/identity"
)

func hashOf(b byte, version identity.HashVersion) identity.Hash {
	return identity.Hash{Version: version, Value: bytes.Repeat([]byte{b}, 64)}
}

func TestEncodeUsersRoundTrip(t *testing.T) {
	users := map[string]identity.Hash{
		"web@prod": hashOf(1, identity.Scrypt),
		"db@prod":  hashOf(2, identity.PBKDF2),
	}
	data := Encode(users)
	want := "db@prod 2 " + strings.Repeat("AgIC", 21) + "Ag==\n" +
		"web@prod 1 " + strings.Repeat("AQEB", 21) + "AQ==\n"
	if string(data) != want {
		t.Fatalf("Encode =\n%s\nwant\n%s", data, want)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, users) {
		t.Fatalf("round trip = %v, want %v", got, users)
	}
	if empty, err := Decode(nil); err != nil || len(empty) != 0 {
		t.Fatalf("Decode(nil) = %v, %v", empty, err)
	}
}

func TestDecodeUsersRejects(t *testing.T) {
	valid := strings.TrimSpace(string(Encode(map[string]identity.Hash{"a@b": hashOf(1, identity.Scrypt)})))
	fields := strings.Fields(valid)
	tests := map[string]struct{ data, want string }{
		"two fields":      {data: "a@b 1\n", want: "got 2 fields"},
		"bad user":        {data: "A@b 1 " + fields[2] + "\n", want: "not a Kopia user name"},
		"bad version":     {data: "a@b one " + fields[2] + "\n", want: `hash version "one"`},
		"unknown version": {data: "a@b 9 " + fields[2] + "\n", want: "unknown password hash version 9"},
		"not base64":      {data: "a@b 1 %%%\n", want: "hash of a@b"},
		"short hash":      {data: "a@b 1 AAAA\n", want: "password hash is 3 bytes"},
		"duplicate":       {data: valid + "\n" + valid + "\n", want: "line 2: user a@b listed twice"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Decode([]byte(tt.data))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestShardsHoldTenThousandUsers checks the sizing the users Secrets rely
// on: 10,000 users spread over every shard, none near a Secret's 1 MiB.
func TestShardsHoldTenThousandUsers(t *testing.T) {
	shards := make([]map[string]identity.Hash, Shards)
	for i := range shards {
		shards[i] = map[string]identity.Hash{}
	}
	for i := range 10_000 {
		name := fmt.Sprintf("vm-%05d@namespace-%03d", i, i%300)
		shards[ShardOf(name)][name] = hashOf(byte(i), identity.Scrypt)
	}
	for i, users := range shards {
		size := len(Encode(users))
		if len(users) == 0 || len(users) > 2*10_000/Shards {
			t.Errorf("shard %d holds %d of 10,000 users: the spread is uneven", i, len(users))
		}
		if size > 128<<10 {
			t.Errorf("shard %d is %d bytes for %d users", i, size, len(users))
		}
	}
}

func TestGrants(t *testing.T) {
	grants := []Grant{{Grantee: "web@team-a", Source: "old@team-a"}, {Grantee: "db@team-a", Source: "old@team-a"}, {Grantee: "web@team-a", Source: "old@team-a"}}
	data := EncodeGrants(grants)
	if want := "db@team-a old@team-a\nweb@team-a old@team-a\n"; string(data) != want {
		t.Fatalf("EncodeGrants = %q, want %q (sorted, once each)", data, want)
	}
	got, err := DecodeGrants(data)
	if err != nil || len(got) != 2 || got[1] != grants[0] {
		t.Fatalf("DecodeGrants = %v, %v", got, err)
	}
	for _, bad := range []string{
		"web@team-a old@team-b\n", // across namespaces
		"web@team-a web@team-a\n", // to itself
		"web@team-a\n",
		"web@team-a old@team-a extra\n",
		"Web@team-a old@team-a\n",
		"*@team-a old@team-a\n", // a wildcard is no identity
	} {
		if _, err := DecodeGrants([]byte(bad)); err == nil {
			t.Errorf("DecodeGrants(%q) accepted", bad)
		}
	}
}

func TestQuotas(t *testing.T) {
	quotas := map[string]int64{"web@team-a": 1 << 30, "db@team-b": 0}
	data := EncodeQuotas(quotas)
	if want := "db@team-b 0\nweb@team-a 1073741824\n"; string(data) != want {
		t.Fatalf("EncodeQuotas = %q, want %q (sorted)", data, want)
	}
	got, err := DecodeQuotas(data)
	if err != nil || len(got) != 2 || got["web@team-a"] != 1<<30 || got["db@team-b"] != 0 {
		t.Fatalf("DecodeQuotas = %v, %v", got, err)
	}
	if got, err := DecodeQuotas(nil); err != nil || len(got) != 0 {
		t.Fatalf("DecodeQuotas(nil) = %v, %v; want no quota", got, err)
	}
	for _, bad := range []string{
		"web@team-a\n",
		"web@team-a 10 extra\n",
		"web@team-a -1\n",
		"web@team-a 1Gi\n",
		"Web@team-a 10\n",
		"web@team-a 10\nweb@team-a 20\n",
	} {
		if _, err := DecodeQuotas([]byte(bad)); err == nil {
			t.Errorf("DecodeQuotas(%q) accepted", bad)
		}
	}
}
