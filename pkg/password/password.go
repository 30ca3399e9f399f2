// Package password generates the secrets guestbackup writes and never shows:
// Kopia repository and server-control passwords, and the per-VM passwords of
// guests. One generator, so every secret has the same strength and alphabet.
package password

import (
	"crypto/rand"
	"encoding/base64"
)

// Bits is the entropy of a password New returns.
const Bits = 256

// New returns Bits random bits, URL-safe base64 encoded without padding (43
// characters of [A-Za-z0-9_-]): safe unquoted in a shell, an environment
// variable, YAML and a URL.
//
// crypto/rand.Read never fails (since Go 1.24 it crashes the program
// instead), so there is no error to return.
func New() string {
	buf := make([]byte, Bits/8)
	_, _ = rand.Read(buf)
	return base64.RawURLEncoding.EncodeToString(buf)
}
