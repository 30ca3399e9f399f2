package cloudinit

import (
	"testing"
)

// generation makes each Bootstrap of the "new" benchmark one never seen
// before, across its repeated runs too.
var generation int64

// BenchmarkCloudConfig is the webhook's rendering of one VM's bootstrap: the
// same Bootstrap again (a re-admission that changes nothing, the steady
// state) and a new one each time (a first admission or a rotation).
func BenchmarkCloudConfig(b *testing.B) {
	base := testBootstrap(b)
	base.Paths = []string{"/etc", "/home"}
	base.Schedule = "daily"
	b.Run("same", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := CloudConfig(base); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			in := base
			generation++
			in.Generation = generation
			if _, err := CloudConfig(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
