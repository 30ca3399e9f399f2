package cloudinit

import (
	"bytes"
	"strconv"
	"strings"
	"sync"
)

// memoSize bounds the renderings kept: one per opted-in VM of a busy
// cluster's recent admissions. A rendering is a few KiB.
const memoSize = 4096

// renderings remembers recent CloudConfig results. The webhook renders a
// VM's bootstrap on every admission of it, to compare with what its Secret
// holds, and in the steady state (a re-admission that changes nothing)
// encoding YAML was two thirds of the handler's CPU. A rendering depends on
// the Bootstrap alone, so a hit is byte for byte what rendering again would
// return.
var renderings = &memo{entries: map[string][]byte{}}

// memo is a bounded map from a Bootstrap's key to its rendering; when full,
// an arbitrary entry makes room (Go's map order), which keeps every
// operation O(1) and needs no bookkeeping.
type memo struct {
	mu      sync.Mutex
	entries map[string][]byte
}

// get returns a copy of the rendering stored under key, so a caller may
// change what it gets.
func (m *memo) get(key string) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.entries[key]
	return bytes.Clone(v), ok
}

func (m *memo) put(key string, v []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.entries[key]; !ok && len(m.entries) >= memoSize {
		for k := range m.entries {
			delete(m.entries, k)
			break
		}
	}
	m.entries[key] = bytes.Clone(v)
}

// key encodes every field of b, each prefixed with its length, so two
// different Bootstraps never share a key whatever their fields hold.
func (b Bootstrap) key() string {
	var k strings.Builder
	field := func(s string) {
		k.WriteString(strconv.Itoa(len(s)))
		k.WriteByte(':')
		k.WriteString(s)
	}
	field(b.ServerURL)
	field(string(b.CA))
	field(b.Username)
	field(b.Password)
	field(strconv.FormatInt(b.Generation, 10))
	field(b.Schedule)
	field(strconv.Itoa(len(b.Paths)))
	for _, p := range b.Paths {
		field(p)
	}
	return k.String()
}
