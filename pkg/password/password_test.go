package password

import (
	"encoding/base64"
	"regexp"
	"testing"
)

func TestNew(t *testing.T) {
	alphabet := regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)
	seen := map[string]bool{}
	for range 100 {
		p := New()
		if !alphabet.MatchString(p) {
			t.Fatalf("New() = %q, want 43 characters of URL-safe base64", p)
		}
		raw, err := base64.RawURLEncoding.DecodeString(p)
		if err != nil || len(raw)*8 != Bits {
			t.Fatalf("New() = %q decodes to %d bits (%v), want %d", p, len(raw)*8, err, Bits)
		}
		if seen[p] {
			t.Fatalf("New() repeated %q", p)
		}
		seen[p] = true
	}
}
