package policy

import (
	"context"
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
