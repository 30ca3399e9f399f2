package logins

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1" //nolint:gosec // {SHA} of a 256-bit random secret: see Credentials
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// Credentials are what the gate hands the Kopia server of its pod in place
// of a guest's password it verified itself: one per user, derived from a
// random key of this process, which the server checks with its htpasswd
// authenticator (`kopia server start --htpasswd-file`, lock-free) instead
// of a slow hash under its one mutex.
//
// A credential is 256 random-looking bits that only this process can
// derive, and the file holds them as {SHA} (unsalted SHA-1), a scheme no
// password should use: a guessable password falls to a fast hash, a
// 256-bit secret does not (finding one from its SHA-1 is a preimage, not a
// guess). The file stays in the pod's own volume, and its credentials mean
// nothing after the process that derived them ends.
type Credentials struct {
	key []byte
}

// NewCredentials returns the credentials of this process.
func NewCredentials() *Credentials {
	// crypto/rand.Read never fails: it crashes the program rather.
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return &Credentials{key: key}
}

// For is user's credential.
func (c *Credentials) For(user string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("guestbackup kopia credential\x00"))
	m.Write([]byte(user))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckUser is the one user of the htpasswd file that is no guest (a
// guest's name always holds an '@'). Its credential changes with every
// file written, so that a login as CheckUser tells whether the Kopia
// server loaded the newest file: Kopia's refresh answers OK even when it
// failed before it reloaded the file.
const CheckUser = "guestbackup-gate-check"

// Check is CheckUser's credential in the file of generation g.
func (c *Credentials) Check(g uint64) string {
	return c.For(CheckUser + "#" + strconv.FormatUint(g, 10))
}

// Htpasswd is the htpasswd file of generation g: CheckUser's credential,
// then users', one line each in name order. User names
// (identity.ValidateUsername) hold no ':' or line break.
func (c *Credentials) Htpasswd(users []string, g uint64) []byte {
	var b bytes.Buffer
	line := func(user, credential string) {
		sum := sha1.Sum([]byte(credential)) //nolint:gosec // see Credentials
		fmt.Fprintf(&b, "%s:{SHA}%s\n", user, base64.StdEncoding.EncodeToString(sum[:]))
	}
	line(CheckUser, c.Check(g))
	for _, u := range slices.Sorted(slices.Values(users)) {
		line(u, c.For(u))
	}
	return b.Bytes()
}

// WriteFile replaces the file at path with content at once (a new file
// renamed over it), so that a reload never reads half of it. Only its
// owner may read it.
func WriteFile(path string, content []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // gone already once renamed
	if _, err := tmp.Write(content); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
