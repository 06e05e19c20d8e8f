package engine_test

import (
	"testing"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// The live tracer is an event source as it is.
var _ engine.Source = (*uprobe.Tracer)(nil)

func TestInterleave(t *testing.T) {
	cases := []struct {
		l     engine.Interleave
		name  string
		valid bool
	}{
		{engine.InterleaveLow, "low", true},
		{engine.InterleaveMedium, "medium", true},
		{engine.InterleaveHigh, "high", true},
		{3, "interleave(3)", false},
	}
	for _, c := range cases {
		if c.l.String() != c.name || c.l.Valid() != c.valid {
			t.Errorf("%d: %q %v, want %q %v", uint32(c.l), c.l.String(), c.l.Valid(), c.name, c.valid)
		}
	}
	// The values are the driver's (NVA06C_CTRL_INTERLEAVE_LEVEL_*).
	if engine.InterleaveLow != 0 || engine.InterleaveMedium != 1 || engine.InterleaveHigh != 2 {
		t.Error("interleave levels do not match the driver's values")
	}
}
