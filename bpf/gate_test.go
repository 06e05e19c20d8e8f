package bpf

import (
	"testing"

	"github.com/cilium/ebpf"
)

// TestLaunchProbesGate checks, in both objects, that every program a launch
// function is attached to consults the launch gate, that the synchronizers'
// programs do not (they never stop a process), that the exit tracepoint
// drops a leaving process's entry, and that the gate map is pinned by name;
// likewise for the stop records (pinned) and the armed gates (not pinned).
func TestLaunchProbesGate(t *testing.T) {
	for _, obj := range []string{"cuda_x86_bpfel.o", "cuda_arm64_bpfel.o"} {
		spec, err := ebpf.LoadCollectionSpec(obj)
		if err != nil {
			t.Fatal(err)
		}
		if m := spec.Maps[CudaMapLaunchGate]; m == nil || m.Pinning != ebpf.PinByName || m.Type != ebpf.Hash {
			t.Errorf("%s: launch gate map %+v: want a hash pinned by name", obj, m)
		}
		// A stop must outlive a daemon killed before it continued the
		// process.
		if m := spec.Maps[CudaMapGateStops]; m == nil || m.Pinning != ebpf.PinByName || m.Type != ebpf.Hash || m.KeySize != 4 || m.ValueSize != 8 {
			t.Errorf("%s: stop records map %+v: want a hash of u32 to u64 pinned by name", obj, m)
		}
		// Arming must die with the daemon that armed it.
		if m := spec.Maps[CudaMapGateArmed]; m == nil || m.Pinning != ebpf.PinNone || m.Type != ebpf.Hash {
			t.Errorf("%s: armed gates map %+v: want a hash that is not pinned", obj, m)
		}
		for prog, want := range map[string]bool{
			CudaProgUprobeLaunch: true, CudaProgUprobeLaunchMulti: true,
			CudaProgUprobeLaunchEx: true, CudaProgUprobeLaunchExMulti: true,
			// cuGraphLaunch shares the copies' program; the cookie's kind
			// selects the gate.
			CudaProgUprobeArgs: true, CudaProgUprobeArgsMulti: true,
			CudaProgSchedExit:  true,
			CudaProgUprobeSync: false, CudaProgUretprobeSync: false,
			CudaProgSchedExec: false, CudaProgUprobeNoop: false,
		} {
			p := spec.Programs[prog]
			if p == nil {
				t.Fatalf("%s: no program %s", obj, prog)
			}
			got, stops, armed := false, false, false
			for _, ins := range p.Instructions {
				switch ins.Reference() {
				case CudaMapLaunchGate:
					got = true
				case CudaMapGateStops:
					stops = true
				case CudaMapGateArmed:
					armed = true
				}
			}
			if got != want {
				t.Errorf("%s: %s uses the launch gate: %v, want %v", obj, prog, got, want)
			}
			// The probes that stop record the stop; the exit drops a
			// leaving process's record.
			if stops != want {
				t.Errorf("%s: %s uses the stop records: %v, want %v", obj, prog, stops, want)
			}
			// The calls that open a request close its armed gates; the
			// exit drops a leaving process's arming.
			if armed != want {
				t.Errorf("%s: %s uses the armed gates: %v, want %v", obj, prog, armed, want)
			}
		}
	}
}
