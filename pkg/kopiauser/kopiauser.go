// Package kopiauser reads and writes the user profiles a Kopia repository
// server authenticates guests against.
//
// Users live in the repository as manifests (labels type=user and
// username=<user@host>, payload {"username","passwordHashVersion",
// "passwordHash"}), so any server opened on the same storage serves the same
// guests. Kopia keeps this format in an internal package, so it is written
// here through Kopia's public repository API; the server authenticates with
// the hashes this package computes, which the test bed proves with a real
// server and client.
package kopiauser

import (
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"golang.org/x/crypto/scrypt"
)

// HashVersion names a password hashing algorithm the way Kopia stores it.
type HashVersion int

const (
	// Scrypt is scrypt with N=65536, r=8, p=1: Kopia's default.
	Scrypt HashVersion = 1
	// PBKDF2 is PBKDF2-HMAC-SHA256 with 600,000 iterations (FIPS-friendly).
	PBKDF2 HashVersion = 2
)

const (
	// manifestType is the value of the type label of user manifests.
	manifestType = "user"
	// usernameLabel is the label holding user@host on user manifests.
	usernameLabel = "username"

	saltLength = 32
	keyLength  = 32
)

var usernamePattern = regexp.MustCompile(`^[a-z0-9\-_.]+@[a-z0-9\-_.]+$`)

// ValidateUsername checks that name is a Kopia user name: user@host in
// lowercase letters, digits, '-', '_' and '.'.
func ValidateUsername(name string) error {
	if !usernamePattern.MatchString(name) {
		return fmt.Errorf("%q is not a Kopia user name: want user@host using only lowercase letters, digits, '-', '_' and '.'", name)
	}
	return nil
}

// Hash is a hashed password: salt followed by the derived key, and the
// algorithm that derived it.
type Hash struct {
	Version HashVersion
	Value   []byte
}

// NewHash hashes password with a fresh random salt. It is deliberately slow
// (that is the point of scrypt and PBKDF2): callers hash each password once
// and keep the result.
func NewHash(password string, version HashVersion) (Hash, error) {
	salt := make([]byte, saltLength)
	if _, err := rand.Read(salt); err != nil {
		return Hash{}, fmt.Errorf("generate salt: %w", err)
	}
	key, err := deriveKey(password, salt, version)
	if err != nil {
		return Hash{}, err
	}
	return Hash{Version: version, Value: append(salt, key...)}, nil
}

// Matches reports whether password is the one h was computed from.
func (h Hash) Matches(password string) bool {
	if len(h.Value) != saltLength+keyLength {
		return false
	}
	key, err := deriveKey(password, h.Value[:saltLength], h.Version)
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare(key, h.Value[saltLength:]) == 1
}

// Validate checks that h has a known version and the length Kopia requires.
func (h Hash) Validate() error {
	if h.Version != Scrypt && h.Version != PBKDF2 {
		return fmt.Errorf("unknown password hash version %d", h.Version)
	}
	if len(h.Value) != saltLength+keyLength {
		return fmt.Errorf("password hash is %d bytes, want %d", len(h.Value), saltLength+keyLength)
	}
	return nil
}

// String encodes h the way `kopia server user set --user-password-hash`
// takes it: base64 of {"passwordHashVersion","passwordHash"}.
func (h Hash) String() string {
	data, _ := json.Marshal(struct { //nolint:errchkjson // plain ints and bytes always encode
		Version int    `json:"passwordHashVersion"`
		Value   []byte `json:"passwordHash"`
	}{int(h.Version), h.Value})
	return base64.StdEncoding.EncodeToString(data)
}

func deriveKey(password string, salt []byte, version HashVersion) ([]byte, error) {
	switch version {
	case Scrypt:
		key, err := scrypt.Key([]byte(password), salt, 65536, 8, 1, keyLength)
		if err != nil {
			return nil, fmt.Errorf("scrypt: %w", err)
		}
		return key, nil
	case PBKDF2:
		key, err := pbkdf2.Key(sha256.New, password, salt, 600_000, keyLength)
		if err != nil {
			return nil, fmt.Errorf("pbkdf2: %w", err)
		}
		return key, nil
	default:
		return nil, fmt.Errorf("unknown password hash version %d", version)
	}
}

// profile is the manifest payload, in Kopia's JSON field names.
type profile struct {
	Username            string `json:"username"`
	PasswordHashVersion int    `json:"passwordHashVersion,omitempty"`
	PasswordHash        []byte `json:"passwordHash"`
}

func labels(username string) map[string]string {
	return map[string]string{manifest.TypeLabelKey: manifestType, usernameLabel: username}
}

// Put creates or replaces the profile of username.
func Put(ctx context.Context, w repo.RepositoryWriter, username string, h Hash) error {
	return put(ctx, w, username, h, true)
}

// put writes the profile of username; replace also removes older profiles of
// the user, which a user known to be new does not need (and a lookup per
// user would make adding many users quadratic).
func put(ctx context.Context, w repo.RepositoryWriter, username string, h Hash, replace bool) error {
	if err := ValidateUsername(username); err != nil {
		return err
	}
	if err := h.Validate(); err != nil {
		return fmt.Errorf("user %s: %w", username, err)
	}
	p := &profile{Username: username, PasswordHashVersion: int(h.Version), PasswordHash: h.Value}
	var err error
	if replace {
		_, err = w.ReplaceManifests(ctx, labels(username), p)
	} else {
		_, err = w.PutManifest(ctx, labels(username), p)
	}
	if err != nil {
		return fmt.Errorf("write profile of %s: %w", username, err)
	}
	return nil
}

// Delete removes every profile of username; deleting a missing user is not an error.
func Delete(ctx context.Context, w repo.RepositoryWriter, username string) error {
	entries, err := w.FindManifests(ctx, labels(username))
	if err != nil {
		return fmt.Errorf("find profile of %s: %w", username, err)
	}
	for _, e := range entries {
		if err := w.DeleteManifest(ctx, e.ID); err != nil {
			return fmt.Errorf("delete profile of %s: %w", username, err)
		}
	}
	return nil
}

// List returns the password hash of every user in the repository.
func List(ctx context.Context, r repo.Repository) (map[string]Hash, error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: manifestType})
	if err != nil {
		return nil, fmt.Errorf("list user profiles: %w", err)
	}
	users := make(map[string]Hash, len(entries))
	for _, e := range manifest.DedupeEntryMetadataByLabel(entries, usernameLabel) {
		var p profile
		if _, err := r.GetManifest(ctx, e.ID, &p); err != nil {
			return nil, fmt.Errorf("read profile of %s: %w", e.Labels[usernameLabel], err)
		}
		version := HashVersion(p.PasswordHashVersion)
		if version == 0 { // profiles written before versions existed are scrypt
			version = Scrypt
		}
		users[e.Labels[usernameLabel]] = Hash{Version: version, Value: p.PasswordHash}
	}
	return users, nil
}

// ParseHash decodes what Hash.String encoded, and validates it.
func ParseHash(s string) (Hash, error) {
	data, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return Hash{}, fmt.Errorf("password hash: %w", err)
	}
	var v struct {
		Version int    `json:"passwordHashVersion"`
		Value   []byte `json:"passwordHash"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return Hash{}, fmt.Errorf("password hash: %w", err)
	}
	h := Hash{Version: HashVersion(v.Version), Value: v.Value}
	return h, h.Validate()
}
