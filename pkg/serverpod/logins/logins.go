// Package logins verifies guests' passwords in the server pod, against
// the hashes the users Secrets list, on as many cores as the pod has, and
// remembers which passwords it verified so that a returning guest costs no
// hash at all.
//
// Kopia's server verifies one password at a time per process (one mutex
// around the hash in internal/auth's repositoryUserAuthenticator), so a
// server pod whose gate left every password to it served about one hash at
// a time whatever its cores. A Verifier hashes in parallel, at most
// Options.Parallel at once (each scrypt hash takes 64 MiB while it runs).
//
// What it remembers is bounded and never outlives what it verified:
//   - one entry per user, made only by a password that matched: a flood of
//     wrong passwords adds nothing and evicts nothing;
//   - the entry is a keyed MAC (HMAC-SHA256 under a random key of this
//     process, never written anywhere) of the user, the exact stored hash
//     and the password: a rotated hash, another password or another user
//     can never match it, and the plaintext is kept no longer than one
//     verification;
//   - at most Options.Capacity entries (one per user the pod serves), and
//     Retain drops those of users no longer listed.
//
// A password that matches no entry costs a full hash, whether the user is
// unknown (Unknown hashes a decoy of the same algorithm), known with a
// wrong password, or known with the right one not yet verified: only the
// right password of a user is ever fast, so how long an answer takes tells
// someone who does not know a password nothing about who exists.
package logins

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/guestbackup/guestbackup/pkg/identity"
)

// DefaultCapacity is Options.Capacity's default: above the users one
// server pod is sized for (docs/operations.md), at about 100 bytes each.
const DefaultCapacity = 100_000

// Verifications counts the passwords a Verifier checked, by how
// (guestbackup_server_password_verifications_total{by="memory|hash"}) and
// whether they matched.
var Verifications = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "guestbackup_server_password_verifications_total",
	Help: "Guests' passwords the server pod verified: by a hash, or from memory of an earlier verification of the same password against the same stored hash.",
}, []string{"by", "result"})

// HashSeconds is the time the pod's verifications spent hashing
// (guestbackup_server_password_hash_seconds_total): its rate is how many
// hashes ran at once on average, which the pod's cores and Options.Parallel
// bound.
var HashSeconds = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "guestbackup_server_password_hash_seconds_total",
	Help: "Time guests' password verifications spent hashing; its rate is the hashes running at once on average.",
})

// Options configure a Verifier.
type Options struct {
	// Parallel bounds the hashes computed at once; 0: GOMAXPROCS.
	Parallel int
	// Capacity bounds the verifications remembered; 0: DefaultCapacity.
	Capacity int
	// Match verifies password against h; nil: h.Matches (tests count
	// hashes with it).
	Match func(h identity.Hash, password string) bool
}

// Verifier verifies passwords against stored hashes. Its zero value is not
// usable: see New.
type Verifier struct {
	// key is the MAC key of the entries: random, this process's only.
	key      []byte
	slots    chan struct{}
	capacity int
	match    func(identity.Hash, string) bool
	// macs reuses HMAC states: one allocation less per login.
	macs sync.Pool

	mu sync.Mutex
	// known is, by user, the MAC of the last password that matched its
	// stored hash, with that hash.
	known map[string][sha256.Size]byte
}

// New returns a Verifier.
func New(o Options) *Verifier {
	if o.Parallel <= 0 {
		o.Parallel = runtime.GOMAXPROCS(0)
	}
	if o.Capacity <= 0 {
		o.Capacity = DefaultCapacity
	}
	if o.Match == nil {
		o.Match = identity.Hash.Matches
	}
	// crypto/rand.Read never fails: it crashes the program rather.
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	v := &Verifier{
		key: key, slots: make(chan struct{}, o.Parallel), capacity: o.Capacity, match: o.Match,
		known: map[string][sha256.Size]byte{},
	}
	v.macs.New = func() any { return hmac.New(sha256.New, v.key) }
	return v
}

// Verify reports whether password matches h, user's stored hash now. A
// password it verified against this very h before is answered from memory;
// any other costs one hash, once a slot is free (ctx's error when the
// caller gave up waiting). Only a match is remembered.
func (v *Verifier) Verify(ctx context.Context, user string, h identity.Hash, password string) (bool, error) {
	tag := v.tag(user, h, password)
	v.mu.Lock()
	have, ok := v.known[user]
	v.mu.Unlock()
	if ok && hmac.Equal(have[:], tag[:]) {
		Verifications.WithLabelValues("memory", "match").Inc()
		return true, nil
	}
	matched, err := v.hash(ctx, h, password)
	if err != nil {
		return false, err
	}
	if !matched {
		Verifications.WithLabelValues("hash", "mismatch").Inc()
		return false, nil
	}
	Verifications.WithLabelValues("hash", "match").Inc()
	v.remember(user, tag)
	return true, nil
}

// Unknown costs what verifying password against a hash of version costs,
// and reports the error of ctx if any: for a user nobody lists, whose
// answer must take as long as a wrong password's.
func (v *Verifier) Unknown(ctx context.Context, version identity.HashVersion, password string) error {
	_, err := v.hash(ctx, decoy(version), password)
	if err == nil {
		Verifications.WithLabelValues("hash", "unknown-user").Inc()
	}
	return err
}

// Retain forgets the verifications of the users keep rejects: those the
// users Secrets no longer list.
func (v *Verifier) Retain(keep func(user string) bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for user := range v.known {
		if !keep(user) {
			delete(v.known, user)
		}
	}
}

// Remembered is how many verifications v holds.
func (v *Verifier) Remembered() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.known)
}

// hash runs one verification in a free slot.
func (v *Verifier) hash(ctx context.Context, h identity.Hash, password string) (bool, error) {
	select {
	case v.slots <- struct{}{}:
	case <-ctx.Done():
		return false, fmt.Errorf("wait to verify a password: %w", context.Cause(ctx))
	}
	defer func() { <-v.slots }()
	start := time.Now()
	defer func() { HashSeconds.Add(time.Since(start).Seconds()) }()
	return v.match(h, password), nil
}

// remember keeps tag as user's verification. When full, an entry of
// another user makes room: only users whose right password was just
// verified get in, so no wrong one ever evicts.
func (v *Verifier) remember(user string, tag [sha256.Size]byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.known[user]; !ok && len(v.known) >= v.capacity {
		for other := range v.known { // the map's own random order
			delete(v.known, other)
			break
		}
	}
	v.known[user] = tag
}

// tag is the MAC of (user, h, password) under v's key, each part
// length-prefixed so that no two triples share an input.
func (v *Verifier) tag(user string, h identity.Hash, password string) [sha256.Size]byte {
	m := v.macs.Get().(hash.Hash)
	defer func() {
		// A state put back as it is would keep the last bytes written:
		// the password's end.
		m.Reset()
		v.macs.Put(m)
	}()
	var n [8]byte
	for _, part := range [][]byte{[]byte(user), binary.BigEndian.AppendUint64(nil, uint64(h.Version)), h.Value, []byte(password)} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		m.Write(n[:])
		m.Write(part)
	}
	var tag [sha256.Size]byte
	m.Sum(tag[:0])
	return tag
}

// decoys are hashes of no one's password, one per version, made on first
// use.
var decoys sync.Map

// decoy is the decoy hash of version; an unknown version gets scrypt's.
func decoy(version identity.HashVersion) identity.Hash {
	if version != identity.PBKDF2 {
		version = identity.Scrypt
	}
	if h, ok := decoys.Load(version); ok {
		return h.(identity.Hash)
	}
	h, err := identity.NewHash(rand.Text(), version)
	if err != nil {
		// Never with a known version; an empty hash matches nothing at
		// once, which is only faster.
		return identity.Hash{}
	}
	actual, _ := decoys.LoadOrStore(version, h)
	return actual.(identity.Hash)
}
