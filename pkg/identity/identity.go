// Package identity is who a guest is to its Kopia server and how its
// password is kept: the user name rule (user@host, which guestbackup fills
// as <vm>@<namespace>), the password hashes Kopia verifies, and the format
// of the user profiles a repository stores them in.
//
// It imports nothing of Kopia, so that the webhook and the controller, which
// name and hash users but never open a repository, do not link Kopia's
// repository code; package kopiauser writes these profiles into a
// repository, in the server pod. Kopia keeps the format in an internal
// package; the test bed proves with a real server and client that it
// authenticates with these hashes.
package identity

import (
	"bytes"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

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

// String names the algorithm as a BSLS's spec.access.passwordHash does:
// scrypt or pbkdf2.
func (v HashVersion) String() string {
	switch v {
	case Scrypt:
		return "scrypt"
	case PBKDF2:
		return "pbkdf2"
	}
	return fmt.Sprintf("version-%d", int(v))
}

const (
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

// OfVM is the Kopia identity of VM vm of namespace: <vm>@<namespace>, a
// user name when both are valid DNS labels. It is stable across
// re-creation of the VM, so a VM restored by GitOps sees its own snapshots.
func OfVM(vm, namespace string) string { return vm + "@" + namespace }

// ClientHostSuffix ends the host part of every BackupClient's identity.
const ClientHostSuffix = ".client"

// OfClient is the Kopia identity of BackupClient name of namespace:
// <name>@<namespace>.client. A namespace is a DNS label, which has no dot,
// so no VM's host part (its namespace) ever equals a client's, and no
// client's identity is ever a VM's (docs/security.md, "Identities"); the
// host part names the namespace, so two clients' identities differ too.
func OfClient(name, namespace string) string { return name + "@" + namespace + ClientHostSuffix }

// ClientOf is the BackupClient whose identity user is (OfClient): its name
// and namespace; false for any other user, a VM's for one.
func ClientOf(user string) (name, namespace string, ok bool) {
	name, host, ok := strings.Cut(user, "@")
	if !ok {
		return "", "", false
	}
	namespace, ok = strings.CutSuffix(host, ClientHostSuffix)
	return name, namespace, ok && name != "" && namespace != "" && !strings.Contains(namespace, ".")
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

// Equal is whether h and o are the same hash, as stored: a password is
// never hashed again to compare.
func (h Hash) Equal(o Hash) bool { return h.Version == o.Version && bytes.Equal(h.Value, o.Value) }

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

// How a repository stores users: one manifest per profile, labelled
// ManifestType under Kopia's type label and the user name under
// LabelUsername, whose payload is a Profile.
const (
	// TypeLabel is Kopia's label naming a manifest's type
	// (manifest.TypeLabelKey).
	TypeLabel = "type"
	// ManifestType is the type of user profile manifests.
	ManifestType = "user"
	// LabelUsername is the label holding user@host on user profiles.
	LabelUsername = "username"
)

// Profile is a user profile manifest's payload, in Kopia's JSON field names.
type Profile struct {
	Username            string `json:"username"`
	PasswordHashVersion int    `json:"passwordHashVersion,omitempty"`
	PasswordHash        []byte `json:"passwordHash"`
}

// ProfileLabels are the labels of username's profile manifest.
func ProfileLabels(username string) map[string]string {
	return map[string]string{TypeLabel: ManifestType, LabelUsername: username}
}

// NewProfile is the profile of username with password hash h, after
// checking both.
func NewProfile(username string, h Hash) (*Profile, error) {
	if err := ValidateUsername(username); err != nil {
		return nil, err
	}
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("user %s: %w", username, err)
	}
	return &Profile{Username: username, PasswordHashVersion: int(h.Version), PasswordHash: h.Value}, nil
}

// Hash is the password hash p holds; profiles written before Kopia had
// hash versions are scrypt.
func (p *Profile) Hash() Hash {
	version := HashVersion(p.PasswordHashVersion)
	if version == 0 {
		version = Scrypt
	}
	return Hash{Version: version, Value: p.PasswordHash}
}
