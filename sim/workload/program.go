package workload

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/trace"
)

// Workload is one process of a spec, ready to be simulated any number of
// times (once per baseline).
type Workload struct {
	// Name is the process's name: the spec's name, or NAME/i for replica i
	// of an LC workload with replicas.
	Name string
	// Group is the spec workload it belongs to: reports merge replicas by
	// it.
	Group string
	Class sim.Class
	GPU   int
	// SLO is set for LC workloads that have one.
	SLO *SLO
	// Source says where it comes from: "lc", "be" or "replay:FILE".
	Source string
	// Labels and Env are the spec's, for the policy of the arbiter
	// baseline.
	Labels, Env map[string]string

	newProgram    func(seed, horizon uint64, d *dispatcher, draws *Draws) sim.Program
	newDispatcher func(seed, horizon uint64) *dispatcher // LC workloads
}

// Program returns a fresh host program for a run of this workload alone
// with the given seed that ends at horizon (virtual ns): LC arrivals stop
// there. Replicas that run together must come from Programs.
func (w *Workload) Program(seed, horizon uint64) sim.Program {
	var d *dispatcher
	if w.newDispatcher != nil {
		d = w.newDispatcher(seed, horizon)
	}
	return w.newProgram(seed, horizon, d, nil)
}

// Programs returns fresh host programs for workloads that run together:
// the replicas of one LC workload among them share its request queue.
// draws, if not nil, shares service times with the other runs of the same
// comparison (same seed) that use it.
func Programs(ws []Workload, seed, horizon uint64, draws *Draws) []sim.Program {
	shared := map[string]*dispatcher{}
	progs := make([]sim.Program, len(ws))
	for i := range ws {
		w := &ws[i]
		var d *dispatcher
		if w.newDispatcher != nil {
			if d = shared[w.Group]; d == nil {
				d = w.newDispatcher(seed, horizon)
				shared[w.Group] = d
			}
		}
		progs[i] = w.newProgram(seed, horizon, d, draws)
	}
	return progs
}

// Options returns the simulator options the spec's model asks for (GPUs
// and model overrides; the caller sets Mode and the run's extras).
func (f *File) Options() (sim.Options, error) {
	o := sim.Options{GPUs: f.Spec.GPUs}
	m := f.Spec.Model
	if m == nil {
		return o, nil
	}
	o.Timeslice = time.Duration(m.Timeslice)
	o.ContextSwitch = time.Duration(m.ContextSwitch)
	o.Preemption = time.Duration(m.Preemption)
	o.BlockDrain = time.Duration(m.BlockDrain)
	o.SpatialSlowdown = m.SpatialSlowdown
	o.CopyBandwidth = m.CopyBandwidth
	o.CopyLatency = time.Duration(m.CopyLatency)
	switch m.Granularity {
	case "block":
		o.Granularity = sim.GranularityBlock
	case "kernel":
		o.Granularity = sim.GranularityKernel
	}
	return o, nil
}

// ControlLatency returns the control latency the spec's model sets for
// closed-loop baselines, nil when it sets none.
func (f *File) ControlLatency() *time.Duration {
	if f.Spec.Model == nil || f.Spec.Model.ControlLatency == nil {
		return nil
	}
	d := time.Duration(*f.Spec.Model.ControlLatency)
	return &d
}

// Workloads builds every workload of the spec, reading arrival files and
// replayed traces.
func (f *File) Workloads() ([]Workload, error) {
	ws, err := f.workloads()
	var fe *FieldError
	if errors.As(err, &fe) && fe.Line == 0 && fe.File == f.Path {
		fe.Line = lineOf(f.lines, fe.Path)
	}
	return ws, err
}

// workloads is Workloads, its errors without their lines.
func (f *File) workloads() ([]Workload, error) {
	var out []Workload
	ss := samplers{}
	for i := range f.Spec.LC {
		lc := f.Spec.LC[i]
		path := fmt.Sprintf("lc[%d]", i)
		times, err := f.arrivalTimes(path, &lc.Arrival)
		if err != nil {
			return nil, err
		}
		steps := compileSteps(lc.Request, ss)
		order, shape := drawOrder(steps), shapeOf(steps)
		marks, words := placeMarks(shape, order), placeFilters(shape)
		pending := lc.MaxPending
		if pending == 0 {
			pending = defaultPending
		}
		h := nameHash(lc.Name)
		var think *sampler
		if lc.Arrival.Think != nil {
			think = ss.get(lc.Arrival.Think)
		}
		newDispatcher := func(seed, horizon uint64) *dispatcher {
			return &dispatcher{
				name:    lc.Name,
				arr:     newArrivals(&lc.Arrival, times, rand.New(rand.NewPCG(seed, h))),
				seeds:   rand.New(rand.NewPCG(seed, ^h)),
				horizon: horizon, maxPending: pending,
				closed: lc.Arrival.Process == "closed", think: think,
			}
		}
		replicas := max(lc.Replicas, 1)
		for r := range replicas {
			name := lc.Name
			if replicas > 1 {
				name = fmt.Sprintf("%s/%d", lc.Name, r)
			}
			out = append(out, Workload{
				Name: name, Group: lc.Name, Class: sim.ClassLC, GPU: lc.GPU, SLO: lc.SLO, Source: "lc", Labels: lc.Labels, Env: lc.Env,
				newDispatcher: newDispatcher,
				newProgram: func(seed, _ uint64, d *dispatcher, draws *Draws) sim.Program {
					p := &lcProgram{d: d, stream: h, steps: steps}
					p.draws = newKeyed(shape, order, p.seed, draws.stream(streamID(lc.Name, false), len(shape), words, marks))
					return p
				},
			})
		}
	}
	for i := range f.Spec.BE {
		be := f.Spec.BE[i]
		every := be.SyncEvery
		if every == 0 {
			every = 1
		}
		var gap *sampler
		if be.HostGap != nil {
			gap = ss.get(be.HostGap)
		}
		k := ss.get(&be.Kernel)
		out = append(out, Workload{
			Name: be.Name, Group: be.Name, Class: sim.ClassBE, GPU: be.GPU, Source: "be", Labels: be.Labels, Env: be.Env,
			newProgram: func(seed, _ uint64, _ *dispatcher, draws *Draws) sim.Program {
				p := &beProgram{runSeed: seed, stream: ^nameHash(be.Name), kernel: k, every: every, gap: gap}
				shape, runs := []segment{{off: 0, n: every, burst: true}}, []drawRun{{k, every}}
				if gap != nil {
					shape, runs = append(shape, segment{off: every, n: 1}), append(runs, drawRun{gap, 1})
				}
				marks, words := placeMarks(shape, runs), placeFilters(shape)
				p.draws = newKeyed(shape, runs, p.seed, draws.stream(streamID(be.Name, true), len(shape), words, marks))
				return p
			},
		})
	}
	opts, _ := f.Options()
	cm := copyModelOf(&opts)
	for i := range f.Spec.Replay {
		ws, err := f.replay(i, cm)
		if err != nil {
			return nil, err
		}
		out = append(out, ws...)
	}
	return out, nil
}

// mix scrambles a stream number (splitmix64's finalizer), so that the
// generators of consecutive cycles start far apart.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func nameHash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// arrivalTimes returns the recorded arrival offsets of a trace arrival.
func (f *File) arrivalTimes(path string, a *Arrival) ([]uint64, error) {
	if a.Process != "trace" {
		return nil, nil
	}
	var times []uint64
	for _, t := range a.Times {
		times = append(times, uint64(t))
	}
	if a.File == "" {
		return times, nil
	}
	name := a.File
	if !filepath.IsAbs(name) {
		name = filepath.Join(f.Dir, name)
	}
	fh, err := os.Open(name)
	if err != nil {
		return nil, &FieldError{File: f.Path, Path: path + ".arrival.file", Msg: err.Error()}
	}
	defer fh.Close()
	return parseArrivals(fh, name)
}

// parseArrivals reads arrival offsets, one duration per line, '#'
// comments and blank lines ignored, non-decreasing.
func parseArrivals(r io.Reader, name string) ([]uint64, error) {
	var times []uint64
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		d, err := parseDuration(s)
		if err != nil || d < 0 || (len(times) > 0 && uint64(d) < times[len(times)-1]) {
			msg := "arrival offsets must be non-negative and non-decreasing"
			if err != nil {
				msg = err.Error()
			}
			return nil, &FieldError{File: name, Line: line, Msg: msg}
		}
		if len(times) >= maxPending*10 {
			return nil, &FieldError{File: name, Line: line, Msg: fmt.Sprintf("more than %d arrivals", maxPending*10)}
		}
		times = append(times, uint64(d))
	}
	if err := sc.Err(); err != nil {
		return nil, &FieldError{File: name, Line: line, Msg: err.Error()}
	}
	if len(times) == 0 {
		return nil, &FieldError{File: name, Msg: "no arrivals"}
	}
	return times, nil
}

// distKind is a Dist's distribution, decoded once so that a draw does not
// compare strings.
type distKind uint8

const (
	distConst distKind = iota
	distExp
	distLognormal
	distUniform
)

// sampler draws durations (ns) from a Dist.
type sampler struct {
	kind         distKind
	mean, lo, hi float64
	mu, sigma    float64
	q            *logNormalTable // log-normal only
	// inner is set where every value of q's inner bins lies within the
	// bounds and rounds to 1 ns or more, so that bound changes none.
	inner bool
}

func newSampler(d *Dist) *sampler {
	s := &sampler{mean: float64(d.Mean), lo: float64(d.Min), hi: float64(d.Max)}
	switch d.Dist {
	case "exp":
		s.kind = distExp
	case "lognormal":
		s.kind = distLognormal
		s.sigma = math.Sqrt(math.Log1p(d.CV * d.CV))
		s.mu = math.Log(s.mean) - s.sigma*s.sigma/2
		s.q = newLogNormalTable(s.mu, s.sigma)
		lo, hi := s.q.v[quantileEdge], s.q.v[quantileN-quantileEdge]
		s.inner = lo >= max(s.lo, 0.5) && hi <= float64(maxDuration) && (s.hi == 0 || hi <= s.hi)
	case "uniform":
		s.kind = distUniform
	}
	return s
}

// samplers holds a spec's samplers by distribution: one for each
// distinct one, however many steps and workloads draw from it (the spec
// of timeslice-inflation has four kernel steps alike), so that the runs
// read one quantile table (32 KiB) for them, not one each. A sampler
// holds nothing that changes: every draw's state is its generator's.
type samplers map[Dist]*sampler

// get returns the sampler of d, made on first use.
func (ss samplers) get(d *Dist) *sampler {
	key := *d
	key.givenMean, key.givenCV = false, false // how it was written draws nothing
	s := ss[key]
	if s == nil {
		s = newSampler(d)
		ss[key] = s
	}
	return s
}

// source is where a sampler takes its uniform bits: a key's generator,
// or an LC stream's arrival generator for think times.
type source interface{ Uint64() uint64 }

// draw returns one draw (a constant takes none from r).
func (s *sampler) draw(r source) uint64 {
	if s.kind == distConst {
		return s.bound(s.mean)
	}
	return s.bound(s.value(r.Uint64()))
}

// value is the distribution's quantile at the probability a uniform
// 64-bit draw u stands for: every distribution is drawn by inversion,
// from one draw each.
func (s *sampler) value(u uint64) float64 {
	switch s.kind {
	case distExp:
		return -s.mean * math.Log(float64(u>>11+1)*0x1p-53) // −ln of (0, 1]
	case distLognormal:
		return s.q.at(u)
	case distUniform:
		return s.lo + float64(u>>11)*0x1p-53*(s.hi-s.lo)
	}
	return s.mean
}

// bound clamps a drawn value to the distribution's bounds and rounds it
// to a whole ns, at least 1.
func (s *sampler) bound(v float64) uint64 {
	if v < s.lo {
		v = s.lo
	}
	if s.hi > 0 && v > s.hi {
		v = s.hi
	}
	if v > float64(maxDuration) {
		v = float64(maxDuration)
	}
	return max(uint64(v+0.5), 1) // v > 0: rounds to the nearest ns, as math.Round, cheaper
}

// drawInto fills buf with draws from g, the same values in the same order
// as calling draw for each. Log-normal draws, nearly all of a run's, are
// taken in batches of 64 by two loops in functions of their own, the
// generator's output (fillUniform), then the table lookup (interpolate),
// with no call in either: apart, each keeps its values in registers
// (written out in drawInto, the mixer's state went through the stack at
// every step). A draw in an outer bin keeps its uniform in place and is
// computed after its batch.
func (s *sampler) drawInto(g *gen, buf []uint64) {
	if s.kind != distLognormal {
		for i := range buf {
			buf[i] = s.draw(g)
		}
		return
	}
	q := s.q
	var edges [64]uint8 // the draws of a batch in an outer bin
	for len(buf) > 0 {
		out := buf[:min(len(buf), len(edges))]
		buf = buf[len(out):]
		if !s.inner {
			for i := range out {
				out[i] = s.bound(q.at(g.Uint64()))
			}
			continue
		}
		g.s = fillUniform(out, g.s)
		for _, i := range edges[:interpolate(out, &q.v, &edges)] {
			out[i] = s.bound(q.at(out[i]))
		}
	}
}

// fillUniform writes the generator's next len(out) outputs from state st
// (gen.Uint64, written out) and returns the state after them.
//
//go:noinline
func fillUniform(out []uint64, st uint64) uint64 {
	for i := range out {
		st += genGamma
		out[i] = mix(st)
	}
	return st
}

// interpolate replaces each uniform of out (at most 64) in an inner bin
// by its quantile from v (logNormalTable.at, inlined, with nothing to
// bound: see sampler.inner), and lists in edges those in an outer bin,
// left in place; it returns how many it listed.
//
//go:noinline
func interpolate(out []uint64, v *[quantileN + 1]float64, edges *[64]uint8) int {
	ne := 0
	for i, u := range out {
		j := u >> (64 - quantileBits)
		if j-quantileEdge >= quantileN-2*quantileEdge {
			edges[ne&63] = uint8(i)
			ne++
			continue
		}
		f := float64(u<<quantileBits>>quantileBits) * quantileFrac
		a := v[j]
		// As uint64(x), for x in [0.5, maxDuration], in one instruction.
		out[i] = uint64(int64(a + f*(v[j+1]-a) + 0.5))
	}
	return ne
}

// arrivals generates arrival times in order.
type arrivals struct {
	kind   string
	rate   float64
	mu     float64
	sigma  float64
	lo, hi float64 // uniform inter-arrival bounds (ns)
	times  []uint64
	i      int
	t      float64
	r      *rand.Rand
}

func newArrivals(a *Arrival, times []uint64, r *rand.Rand) *arrivals {
	g := &arrivals{kind: a.Process, rate: a.Rate, times: times, r: r, lo: float64(a.Min), hi: float64(a.Max)}
	if g.kind == "lognormal" {
		g.sigma = a.Sigma
		if g.sigma == 0 {
			g.sigma = 1
		}
		g.mu = math.Log(1e9/a.Rate) - g.sigma*g.sigma/2
	}
	return g
}

// next returns the next arrival (ns) or false when there are no more.
func (g *arrivals) next() (uint64, bool) {
	switch g.kind {
	case "trace":
		if g.i == len(g.times) {
			return 0, false
		}
		g.i++
		return g.times[g.i-1], true
	case "periodic":
		v := float64(g.i) * 1e9 / g.rate
		g.i++
		return uint64(v), true
	case "lognormal":
		g.t += math.Exp(g.mu + g.sigma*g.r.NormFloat64())
	case "uniform":
		g.t += g.lo + g.r.Float64()*(g.hi-g.lo)
	default:
		g.t += g.r.ExpFloat64() * 1e9 / g.rate
	}
	return uint64(g.t), true
}

type stepKind uint8

const (
	stepCopy stepKind = iota
	stepKernel
	stepSync
	stepHost
)

type step struct {
	kind     stepKind
	dir      trace.CopyDir
	bytes    uint64
	count    int
	syncEach bool
	dur      *sampler
}

// drawRun is a run of consecutive draws from one sampler.
type drawRun struct {
	s *sampler
	n int
}

// drawOrder lists the samplers of a request's service times in the order
// the request draws them, in runs: each kernel step's kernels, and each
// host step.
func drawOrder(steps []step) []drawRun {
	var out []drawRun
	for _, st := range steps {
		switch st.kind {
		case stepKernel:
			out = append(out, drawRun{st.dur, st.count})
		case stepHost:
			out = append(out, drawRun{st.dur, 1})
		}
	}
	return out
}

// shapeOf lays out a request's draws (drawOrder) as its program hands
// them to the simulator: a step's kernels launched back to back are one
// burst, a kernel synchronized on its own or a host step one draw.
func shapeOf(steps []step) []segment {
	var out []segment
	off := 0
	for _, st := range steps {
		switch {
		case st.kind == stepKernel && !st.syncEach && st.count > 1:
			out = append(out, segment{off: off, n: st.count, burst: true})
			off += st.count
		case st.kind == stepKernel:
			for range st.count {
				out = append(out, segment{off: off, n: 1})
				off++
			}
		case st.kind == stepHost:
			out = append(out, segment{off: off, n: 1})
			off++
		}
	}
	return out
}

func compileSteps(in []Step, ss samplers) []step {
	var out []step
	for _, s := range in {
		switch {
		case s.Copy != nil:
			dir := trace.CopyHtoD
			if s.Copy.Dir == "d2h" {
				dir = trace.CopyDtoH
			}
			out = append(out, step{kind: stepCopy, dir: dir, bytes: s.Copy.Bytes})
		case s.Kernel != nil:
			out = append(out, step{kind: stepKernel, count: max(s.Kernel.Count, 1), syncEach: s.Kernel.SyncEach, dur: ss.get(&s.Kernel.Duration)})
		case s.Sync != nil:
			out = append(out, step{kind: stepSync})
		case s.Host != nil:
			out = append(out, step{kind: stepHost, dur: ss.get(&s.Host.Duration)})
		}
	}
	return out
}

// beProgram launches kernels back to back with a sync every `every`.
//
// A cycle is every kernels, a sync and the host gap. Its service times
// (the kernels', then the gap's) come from a generator seeded from the
// run's seed, the workload's name and the cycle's number, so they are
// the same in every run, drawn in any order, and shared through draws.
type beProgram struct {
	runSeed, stream uint64
	kernel          *sampler
	gap             *sampler
	every           int

	draws   *keyed // segments: the cycle's kernels, its gap
	cycle   uint64
	inCycle bool
	synced  bool
}

// seed seeds g for cycle's service times (its kernels', then its gap's).
func (p *beProgram) seed(g *gen, cycle, _ uint64) {
	g.seed(p.runSeed, mix(p.stream^cycle))
}

// Next implements sim.Program.
func (p *beProgram) Next(now uint64) (op sim.Op, err error) {
	err = p.NextInto(now, &op)
	return op, err
}

// NextInto implements sim.ProgramInto.
func (p *beProgram) NextInto(_ uint64, op *sim.Op) error {
	for {
		switch {
		case !p.inCycle:
			p.inCycle = true
			p.draws.load(p.cycle, p.cycle)
			p.draws.kernels(0, op)
		case !p.synced:
			p.synced = true
			put(op, sim.OpSync, 0, 0)
		default:
			p.inCycle, p.synced = false, false
			p.cycle++
			if p.gap == nil {
				continue
			}
			put(op, sim.OpSleep, p.draws.single(1), 0)
		}
		return nil
	}
}

// put writes an operation of kind into op, field by field (the caller
// sets the fields past Dur and At). Assigning a whole sim.Op builds it on
// the stack and copies it in 16-byte pieces, which the processor cannot
// forward from the narrower stores that built it: a stall for every
// operation.
func put(op *sim.Op, kind sim.OpKind, dur, at uint64) {
	op.Kind, op.Dur, op.At, op.Bytes, op.Dir = kind, dur, at, 0, 0
	op.Durs, op.Burst, op.Count = nil, nil, 0
}
