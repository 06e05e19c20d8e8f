package sim

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// randomProgram issues a random mix of operations, with requests.
type randomProgram struct {
	r     *rand.Rand
	inReq bool
	n     int
}

func (p *randomProgram) Next(now uint64) (Op, error) {
	p.n++
	if p.n > 400 {
		if p.inReq {
			p.inReq = false
			return Op{Kind: OpEnd}, nil
		}
		return Op{Kind: OpStop}, nil
	}
	switch k := p.r.IntN(10); {
	case k < 3:
		return Op{Kind: OpKernel, Dur: 1 + p.r.Uint64N(3000*us)}, nil
	case k < 4:
		durs := make([]uint64, 1+p.r.IntN(5))
		for i := range durs {
			durs[i] = 1 + p.r.Uint64N(500*us)
		}
		return Op{Kind: OpKernel, Durs: durs}, nil
	case k < 5:
		return Op{Kind: OpCopy, Bytes: p.r.Uint64N(1 << 24), Dir: trace.CopyDir(1 + p.r.IntN(2))}, nil
	case k < 6:
		return Op{Kind: OpSync}, nil
	case k < 7:
		return Op{Kind: OpSleep, Dur: p.r.Uint64N(2000 * us)}, nil
	case k < 8:
		if p.inReq {
			p.inReq = false
			return Op{Kind: OpEnd}, nil
		}
		p.inReq = true
		return Op{Kind: OpBegin, At: now}, nil
	default:
		return Op{Kind: OpWaitUntil, At: now + p.r.Uint64N(1000*us)}, nil
	}
}

// checkInvariants runs a random node and checks what must hold in any
// schedule: no kernel lost, no engine busier than the time that passed,
// every executed ns accounted to a process.
func checkInvariants(t *testing.T, seed uint64, ctlSeed uint64) {
	r := rand.New(rand.NewPCG(seed, ctlSeed))
	opts := &Options{
		GPUs: 1 + r.IntN(3), Mode: Mode(r.IntN(4)), Granularity: Granularity(r.IntN(3)),
		Timeslice: time.Duration(1+r.IntN(2000)) * time.Microsecond, ContextSwitch: time.Duration(1+r.IntN(50)) * time.Microsecond,
		Preemption: time.Duration(1+r.IntN(50)) * time.Microsecond, ControlLatency: time.Duration(r.IntN(2)*r.IntN(500)) * time.Microsecond,
		Observe: true, TimelineWindow: time.Second,
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	n := 1 + r.IntN(6)
	for i := range n {
		if _, err := s.Add(Process{Name: fmt.Sprint("p", i), Class: Class(r.IntN(2)), GPU: r.IntN(opts.GPUs),
			Program: &randomProgram{r: rand.New(rand.NewPCG(seed, uint64(i)))}, Interleave: new(sched.InterleaveLow)}); err != nil {
			t.Fatal(err)
		}
	}
	end := uint64(50+r.IntN(200)) * uint64(time.Millisecond)
	s.Start(end)
	var ev trace.Event
	for {
		err := s.Read(&ev)
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatal(err)
		}
		// A random controller.
		pid := uint32(FirstPID + r.IntN(n))
		gpu := s.procs[pid-FirstPID].gpu
		switch r.IntN(12) {
		case 0:
			_ = s.Suspend(pid, gpu)
		case 1:
			_ = s.Resume(pid, gpu)
		case 2:
			_ = s.SetTimeslice(pid, gpu, 1+r.Uint64N(3000))
		case 3:
			_ = s.SetInterleave(pid, engineLevel(r.IntN(3)))
		case 4:
			_ = s.Gate(pid)
		case 5:
			_ = s.Ungate(pid)
		}
	}
	st := s.Stats()
	if st.End != end {
		t.Errorf("end %d, want %d", st.End, end)
	}
	var work uint64
	for _, p := range st.Procs {
		if p.KernelsSubmitted != p.KernelsCompleted+p.KernelsInFlight {
			t.Errorf("%s: submitted %d ≠ completed %d + in flight %d", p.Name, p.KernelsSubmitted, p.KernelsCompleted, p.KernelsInFlight)
		}
		if p.CompletedWork > p.GPUTime {
			t.Errorf("%s: completed work %d > GPU time %d", p.Name, p.CompletedWork, p.GPUTime)
		}
		if p.Requests > p.RequestsBegun || p.RequestsBegun > p.Requests+1 {
			t.Errorf("%s: requests %d begun %d", p.Name, p.Requests, p.RequestsBegun)
		}
		work += p.GPUTime
	}
	var busy uint64
	for i, g := range st.GPUs {
		if g.Busy+g.SwitchTime+g.PreemptTime > end {
			t.Errorf("gpu %d: busy %d + switching %d + saving %d > %d", i, g.Busy, g.SwitchTime, g.PreemptTime, end)
		}
		busy += g.Busy
	}
	if opts.Mode != ModeSpatial && work != busy {
		t.Errorf("work %d ≠ busy %d", work, busy)
	}
	// Timeline segments of one GPU never overlap (except co-running ones),
	// and, the window covering the whole run, add up to the GPU's time
	// running, switching and saving.
	last := map[int]uint64{}
	sums := make([][3]uint64, len(st.GPUs))
	for _, seg := range st.Timeline {
		if opts.Mode == ModeSpatial {
			continue
		}
		if seg.Start < last[seg.GPU] || seg.End < seg.Start {
			t.Fatalf("timeline overlap at %+v (previous end %d)", seg, last[seg.GPU])
		}
		last[seg.GPU] = seg.End
		sums[seg.GPU][seg.Kind] += seg.End - seg.Start
	}
	for i, g := range st.GPUs {
		if opts.Mode == ModeSpatial || st.TimelineDropped > 0 {
			break
		}
		if want := [3]uint64{g.Busy, g.SwitchTime, g.PreemptTime}; sums[i] != want {
			t.Errorf("gpu %d: timeline runs, switches and saves %v, want %v (busy, switching, saving)", i, sums[i], want)
		}
	}
}

func FuzzInvariants(f *testing.F) {
	for i := range uint64(40) {
		f.Add(i, i*7+1)
	}
	f.Fuzz(func(t *testing.T, seed, ctl uint64) { checkInvariants(t, seed, ctl) })
}

func engineLevel(i int) sched.Interleave { return sched.Interleave(i) }
