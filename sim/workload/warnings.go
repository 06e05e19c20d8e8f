package workload

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/trace"
)

// warnings lists values a spec gives explicitly that are valid but
// probably not meant: a 0 where 0 stands for a default (a 0s timeslice is
// not a zero timeslice). given holds the paths present in the file.
func (s *Spec) warnings(given map[string]int) []*FieldError {
	var out []*FieldError
	zero := func(path string, isZero bool, means, instead string) {
		if _, ok := given[path]; ok && isZero {
			msg := "0 means the default (" + means + ")"
			if instead != "" {
				msg += "; " + instead
			}
			out = append(out, &FieldError{Path: path, Msg: msg})
		}
	}
	def, _ := (&sim.Options{}).WithDefaults()
	practically := "write 1ns for practically none"
	zero("duration", s.Duration == 0, "--duration, else 60s", "")
	if m := s.Model; m != nil {
		zero("model.timeslice", m.Timeslice == 0, def.Timeslice.String(), "")
		zero("model.context_switch", m.ContextSwitch == 0, def.ContextSwitch.String(), practically)
		zero("model.preemption", m.Preemption == 0, def.Preemption.String(), practically)
		zero("model.block_drain", m.BlockDrain == 0, def.BlockDrain.String(), practically)
		zero("model.copy_latency", m.CopyLatency == 0, def.CopyLatency.String(), practically)
		zero("model.spatial_slowdown", m.SpatialSlowdown == 0, fmt.Sprint(def.SpatialSlowdown),
			"not \"no interference\": write 0.001 for almost none")
		zero("model.copy_bandwidth", m.CopyBandwidth == 0, fmt.Sprintf("%g bytes/s", def.CopyBandwidth), "")
	}
	for i := range s.LC {
		lc := &s.LC[i]
		p := fmt.Sprintf("lc[%d]", i)
		zero(p+".max_pending", lc.MaxPending == 0, fmt.Sprint(defaultPending), "")
		zero(p+".arrival.sigma", lc.Arrival.Sigma == 0, "1", "")
		for j, st := range lc.Request {
			if st.Kernel != nil {
				zero(fmt.Sprintf("%s.request[%d].kernel.count", p, j), st.Kernel.Count == 0, "1 kernel", "")
			}
		}
	}
	for i := range s.BE {
		zero(fmt.Sprintf("be[%d].sync_every", i), s.BE[i].SyncEvery == 0, "a sync after every kernel", "")
	}
	for i := range s.Replay {
		for j, rp := range s.Replay[i].Processes {
			zero(fmt.Sprintf("replay[%d].processes[%d].request_gap", i, j), rp.RequestGap == 0,
				trace.DefaultIdleGap.String(), practically)
		}
	}
	return out
}

// LoadWarnings checks the load the LC workloads offer each GPU before a
// run of duration d: where their requests ask for more kernel time per
// second than the GPU has, no baseline can serve them, their queues fill
// up to max_pending and later arrivals are turned away, and simulating
// them costs wall time for nothing. Each warning gives the numbers.
// Recorded arrivals count over the whole run; replayed processes and
// arrivals read from a file are not estimated.
func LoadWarnings(f *File, d time.Duration) []string {
	s := &f.Spec
	load := make([]float64, s.GPUs)
	who := make([][]string, s.GPUs)
	growth := make([]float64, len(s.LC))
	for i := range s.LC {
		lc := &s.LC[i]
		rate := arrivalRate(&lc.Arrival, d)
		if rate == 0 {
			continue
		}
		var work float64 // kernel ns per request
		for _, st := range lc.Request {
			if st.Kernel != nil {
				work += float64(max(st.Kernel.Count, 1)) * st.Kernel.Duration.mean()
			}
		}
		load[lc.GPU] += rate * work / 1e9
		who[lc.GPU] = append(who[lc.GPU], lc.Name)
		if lc.Arrival.Process != "trace" {
			growth[i] = rate // recorded arrivals are too few or too uneven to say when a queue fills
		}
	}
	var out []string
	for g, l := range load {
		if l <= 1 {
			continue
		}
		subject, object := "the LC workloads "+strings.Join(who[g], ", ")+" ask", "them, and their queues grow"
		if len(who[g]) == 1 {
			subject, object = "the LC workload "+who[g][0]+" asks", "it, and its queue grows"
		}
		msg := fmt.Sprintf("gpu %d: %s for %.3g s of kernel time per simulated second, %.3g× what the GPU has: "+
			"no baseline can serve %s", g, subject, l, l, object)
		for i := range s.LC {
			lc := &s.LC[i]
			if lc.GPU != g || growth[i] == 0 {
				continue
			}
			pending := lc.MaxPending
			if pending == 0 {
				pending = defaultPending
			}
			// At best the GPU serves 1/l of the arrivals.
			if t := time.Duration(float64(pending) / (growth[i] * (1 - 1/l)) * 1e9); t < d {
				msg += fmt.Sprintf("; %s has max_pending %d requests waiting after about %v and turns later ones away", lc.Name, pending, t.Round(time.Millisecond))
			}
		}
		out = append(out, msg+"; lower the rates or the kernel times, or spread the workloads over more GPUs")
	}
	return out
}

// arrivalRate is the mean arrival rate of a over a run of duration d, 0
// where it is not known without reading a file.
func arrivalRate(a *Arrival, d time.Duration) float64 {
	switch a.Process {
	case "uniform":
		return 2e9 / float64(a.Min+a.Max)
	case "closed":
		return 0 // a closed workload asks no more than it is served
	case "trace":
	default:
		return a.Rate
	}
	// Recorded arrivals do not repeat: what they ask is spread over the
	// run, however close together they come.
	if d <= 0 {
		return 0
	}
	n := 0
	for _, t := range a.Times {
		if time.Duration(t) < d {
			n++
		}
	}
	return float64(n) / d.Seconds()
}

// mean is a distribution's mean in ns, clamps ignored.
func (d *Dist) mean() float64 {
	if d.Dist == "uniform" {
		return float64(d.Min+d.Max) / 2
	}
	return float64(d.Mean)
}
