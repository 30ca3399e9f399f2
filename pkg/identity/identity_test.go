package identity

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestValidateUsername(t *testing.T) {
	for name, valid := range map[string]bool{
		"vm-a@ns-a":    true,
		"web.1@prod_2": true,
		"VM@ns":        false, // Kopia lowercases nothing: uppercase never authenticates
		"vm":           false,
		"@ns":          false,
		"vm@":          false,
		"vm@ns@x":      false,
		"vm a@ns":      false,
		"vm@ns/other":  false,
		"vm@ns\n":      false,
	} {
		if err := ValidateUsername(name); (err == nil) != valid {
			t.Errorf("ValidateUsername(%q) = %v, want valid=%v", name, err, valid)
		}
	}
}

// TestHashVersionNames: the names are the values of a BSLS's
// spec.access.passwordHash, as the hash counter's label shows them.
func TestHashVersionNames(t *testing.T) {
	for v, want := range map[HashVersion]string{Scrypt: "scrypt", PBKDF2: "pbkdf2", 0: "version-0", 7: "version-7"} {
		if got := v.String(); got != want {
			t.Errorf("HashVersion(%d).String() = %q, want %q", int(v), got, want)
		}
	}
}

func TestHash(t *testing.T) {
	for _, version := range []HashVersion{Scrypt, PBKDF2} {
		h, err := NewHash("correct horse", version)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("version %d: fresh hash invalid: %v", version, err)
		}
		if !h.Matches("correct horse") {
			t.Errorf("version %d: hash does not match its password", version)
		}
		if h.Matches("correct horse ") || h.Matches("") {
			t.Errorf("version %d: hash matches another password", version)
		}
		again, err := NewHash("correct horse", version)
		if err != nil {
			t.Fatal(err)
		}
		if string(again.Value) == string(h.Value) {
			t.Errorf("version %d: two hashes of one password are equal: the salt is not random", version)
		}

		// String is the encoding `kopia server user set --user-password-hash` takes.
		data, err := base64.StdEncoding.DecodeString(h.String())
		if err != nil {
			t.Fatal(err)
		}
		var decoded struct {
			Version int    `json:"passwordHashVersion"`
			Value   []byte `json:"passwordHash"`
		}
		if err := json.Unmarshal(data, &decoded); err != nil {
			t.Fatal(err)
		}
		if HashVersion(decoded.Version) != version || string(decoded.Value) != string(h.Value) {
			t.Errorf("version %d: String does not round-trip: %s", version, data)
		}
		parsed, err := ParseHash(h.String())
		if err != nil || parsed.Version != h.Version || string(parsed.Value) != string(h.Value) {
			t.Errorf("version %d: ParseHash(String()) = %v, %v", version, parsed, err)
		}
	}
}

func TestParseHashRejects(t *testing.T) {
	for _, s := range []string{"", "%%%", "bm90IGpzb24=", (Hash{Version: 7, Value: make([]byte, 64)}).String()} {
		if _, err := ParseHash(s); err == nil {
			t.Errorf("ParseHash(%q) accepted it", s)
		}
	}
}

func TestHashValidateRejects(t *testing.T) {
	for name, h := range map[string]Hash{
		"unknown version": {Version: 3, Value: make([]byte, 64)},
		"short":           {Version: Scrypt, Value: make([]byte, 63)},
		"empty":           {Version: PBKDF2},
	} {
		if err := h.Validate(); err == nil {
			t.Errorf("%s: Validate accepted it", name)
		}
		if h.Matches("") {
			t.Errorf("%s: Matches accepted a password", name)
		}
	}
}

// BenchmarkNewHash shows why each password is hashed once and the hash kept:
// every hash costs what Kopia's server spends on one login.
func BenchmarkNewHash(b *testing.B) {
	for _, bc := range []struct {
		name    string
		version HashVersion
	}{{"scrypt", Scrypt}, {"pbkdf2", PBKDF2}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewHash("correct horse", bc.version); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestOfVM(t *testing.T) {
	if got := OfVM("web", "team-a"); got != "web@team-a" {
		t.Errorf("OfVM = %q, want web@team-a", got)
	}
	if err := ValidateUsername(OfVM("web-1", "team-a")); err != nil {
		t.Errorf("a VM's identity is not a user name: %v", err)
	}
}

// A client's identity is a Kopia user name, and never any VM's: its host
// part has a dot, and a VM's host part is its namespace, a DNS label, which
// never has one; so even a client named like a VM of its namespace, or in
// a namespace named "client", takes no VM's identity.
func TestOfClient(t *testing.T) {
	for _, tc := range []struct{ name, namespace, want string }{
		{name: "dbdump", namespace: "shop", want: "dbdump@shop.client"},
		{name: "a.b", namespace: "c", want: "a.b@c.client"},
		{name: "x", namespace: "client", want: "x@client.client"},
	} {
		got := OfClient(tc.name, tc.namespace)
		if got != tc.want {
			t.Errorf("OfClient(%q, %q) = %q, want %q", tc.name, tc.namespace, got, tc.want)
		}
		if err := ValidateUsername(got); err != nil {
			t.Errorf("OfClient(%q, %q) is not a user name: %v", tc.name, tc.namespace, err)
		}
		if got == OfVM(tc.name, tc.namespace) {
			t.Errorf("OfClient(%q, %q) = %q, the identity of the VM of that name", tc.name, tc.namespace, got)
		}
		_, host, _ := strings.Cut(got, "@")
		if errs := validation.IsDNS1123Label(host); len(errs) == 0 {
			t.Errorf("OfClient(%q, %q) has host %q, a valid namespace name: some VM's identity could equal it", tc.name, tc.namespace, host)
		}
		if name, namespace, ok := ClientOf(got); !ok || name != tc.name || namespace != tc.namespace {
			t.Errorf("ClientOf(%q) = %q, %q, %v; want %q, %q", got, name, namespace, ok, tc.name, tc.namespace)
		}
	}
}

// ClientOf names the BackupClient of a client's identity, and none of any
// other user's.
func TestClientOfOthers(t *testing.T) {
	for _, user := range []string{"web@team-a", "web", "@shop.client", "x@.client", "x@a.b.client", "x@shop.clients", "x@shop"} {
		if name, namespace, ok := ClientOf(user); ok {
			t.Errorf("ClientOf(%q) = %q, %q: a client's", user, name, namespace)
		}
	}
}
