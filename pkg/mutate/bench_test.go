package mutate

import (
	"runtime"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// BenchmarkDecide is the webhook's own work per admission, in process: a
// typical VM's first admission (render, merge, patch) and re-admission (no
// change), and kubevirt.io/api's fully populated VM. It reports p50 and p99
// of the wall time besides the mean, and of the CPU time each decision took
// (cpu-p50-µs, cpu-p99-µs): on a machine whose cores other work shares, the
// wall time's tail is the scheduler's. Target: p99 <= 1 ms.
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
	var times, cpu []time.Duration
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		start, startCPU := time.Now(), testbed.ThreadCPU()
		d, err := Decide(in)
		times = append(times, time.Since(start))
		cpu = append(cpu, testbed.ThreadCPU()-startCPU)
		// Measured is what the name says: an injection, or a
		// re-admission that changes nothing.
		want := OutcomeIssued
		if again {
			want = OutcomeUnchanged
		}
		if err != nil || d.Denied != "" || d.Outcome != want || (again && (len(d.Patch) != 0 || d.Secret != nil)) {
			b.Fatalf("want %s: %v %s %s %v", want, err, d.Outcome, d.Denied, d.Patch)
		}
	}
	b.ReportMetric(float64(testbed.Percentile(times, 50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(testbed.Percentile(times, 99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(testbed.Percentile(cpu, 50).Microseconds()), "cpu-p50-µs")
	b.ReportMetric(float64(testbed.Percentile(cpu, 99).Microseconds()), "cpu-p99-µs")
}
