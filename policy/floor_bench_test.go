package policy

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkBuildInput is the share of a classification spent building the
// input document (GPU list not cached).
func BenchmarkBuildInput(b *testing.B) {
	in := benchInput()
	b.ReportAllocs()
	for range b.N {
		_ = in.value(nil)
	}
}

// BenchmarkLatencyFloor is the machine's share of the latency figures: a
// loop that only computes, timed the same way. On a paravirtualised guest
// an interrupt landing in a timed call is counted in the call's CPU time,
// so any call longer than a few µs has a p99 well above its p50; compare a
// classification's p99 with the loop whose p50 is closest.
func BenchmarkLatencyFloor(b *testing.B) {
	for _, n := range []int{4000, 8000, 16000, 32000} {
		b.Run(fmt.Sprintf("loop%d", n), func(b *testing.B) {
			x := 0
			reportLatency(b, func() {
				for i := range n * 3 {
					x += i
				}
			})
			if x == 1 {
				b.Log(x) // keeps the loop
			}
		})
	}
}

// BenchmarkClassifyTrivial is the floor: a policy that returns its
// default, so the difference to the other figures is the policy's own cost.
func BenchmarkClassifyTrivial(b *testing.B) {
	p, err := Load(context.Background(), writeDir(b, map[string]string{"p.rego": header + "classify := default_decision\n"}), nil)
	if err != nil {
		b.Fatal(err)
	}
	in := benchInput()
	reportLatency(b, func() {
		if _, err := p.Classify(context.Background(), in); err != nil {
			b.Fatal(err)
		}
	})
}
