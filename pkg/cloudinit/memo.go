package cloudinit

import (
	"bytes"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/utils/lru"
)

// memoSize bounds the renderings kept: one per opted-in VM of a busy
// cluster's recent admissions. A rendering is a few KiB.
const memoSize = 4096

// renderings remembers recent CloudConfig results, the least recently used
// making room. The webhook renders a VM's bootstrap on every admission of
// it, to compare with what its Secret holds, and in the steady state (a
// re-admission that changes nothing) encoding YAML was two thirds of the
// handler's CPU: BenchmarkCloudConfig measures a hit at about 1% of a
// rendering. A rendering depends on the Bootstrap alone, so a hit is byte
// for byte what rendering again would return.
var renderings = lru.New(memoSize)

// remembered returns a copy of the rendering of the Bootstrap whose key is
// key, so a caller may change what it gets.
func remembered(key string) ([]byte, bool) {
	v, ok := renderings.Get(key)
	if !ok {
		return nil, false
	}
	return bytes.Clone(v.([]byte)), true
}

// remember keeps a copy of a rendering, which its caller may change.
func remember(key string, rendered []byte) {
	renderings.Add(key, bytes.Clone(rendered))
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
	field(strconv.FormatInt(int64(b.Spread), 10))
	field(strconv.Itoa(len(b.Paths)))
	for _, p := range b.Paths {
		field(p)
	}
	if c := b.Client; c != nil {
		field(c.URL)
		field(c.Version)
		// Every entry, so that a bootstrap Validate refuses never shares
		// the key of one it accepted.
		field(strconv.Itoa(len(c.SHA256)))
		for _, arch := range slices.Sorted(maps.Keys(c.SHA256)) {
			field(arch)
			field(c.SHA256[arch])
		}
	}
	return k.String()
}
