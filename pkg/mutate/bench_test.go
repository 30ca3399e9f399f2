package mutate

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkDecide is the webhook's own work per admission, in process: a
// typical VM's first admission (render, merge, patch) and re-admission (no
// change), and kubevirt.io/api's fully populated VM. It reports p50 and p99
// besides the mean. Target: p99 <= 1 ms.
func BenchmarkDecide(b *testing.B) {
	cases := map[string][]byte{
		"typical":         readVM(b, "no-cloud-init"),
		"merged":          readVM(b, "inline-cloud-config"),
		"fully-populated": kubevirtFixture(b),
	}
	for name, obj := range cases {
		b.Run(name+"/first", func(b *testing.B) { benchDecide(b, obj, false) })
		b.Run(name+"/again", func(b *testing.B) { benchDecide(b, obj, true) })
	}
}

func benchDecide(b *testing.B, obj []byte, again bool) {
	pw := &passwords{}
	in := Input{Object: obj, Namespace: "team-a", Server: readyServer(), NewPassword: pw.next}
	if again {
		d, err := Decide(in)
		if err != nil || d.Denied != "" {
			b.Fatalf("%v %s", err, d.Denied)
		}
		in.Object = apply(b, obj, d)
		in.Secret = d.Secret
	}
	var times []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		d, err := Decide(in)
		times = append(times, time.Since(start))
		if err != nil || d.Denied != "" || (again && len(d.Patch) != 0) {
			b.Fatalf("%v %s %v", err, d.Denied, d.Patch)
		}
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs")
}
