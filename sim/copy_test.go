package sim

import (
	"context"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// TestCopySizes: each copy takes Options.CopyDuration of its own size,
// whatever the size of the copies before it in either direction.
func TestCopySizes(t *testing.T) {
	sizes := []struct {
		n   uint64
		dir trace.CopyDir
	}{{25_000_000, trace.CopyHtoD}, {5000, trace.CopyDtoH}, {2_500_000, trace.CopyHtoD}, {25_000_000, trace.CopyHtoD},
		{50_000, trace.CopyDtoH}, {5000, trace.CopyDtoH}, {2_500_000, trace.CopyHtoD}}
	cp := &script{}
	for _, c := range sizes {
		cp.ops = append(cp.ops, Op{Kind: OpCopy, Bytes: c.n, Dir: c.dir}, Op{Kind: OpSync})
	}
	opts := &Options{}
	s, _ := mustSim(t, opts, Process{Name: "A", Program: cp})
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	resolved, err := opts.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	var want [2]uint64
	for _, c := range sizes {
		want[copyEngine(c.dir)] += resolved.CopyDuration(c.n)
	}
	if got := s.Stats().GPUs[0].CopyTime; got != want || want[0] != 4*10*us+2000*us+200*us {
		t.Errorf("copy time per engine %v, want %v (host to device 2.24 ms)", got, want)
	}
}
