// Package whatif runs one workload under several baselines with the same
// seed and compares them: exclusive (each workload alone), the driver's
// default time-slicing, MPS-like spatial sharing, ideal priority, scripted
// closed-loop policies, and (once the engine exists) Arbiter itself.
package whatif

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/hist"
	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/scripted"
	"github.com/gpu-arbiter/arbiter/sim/workload"
	"github.com/gpu-arbiter/arbiter/trace"
)

// Baseline names.
const (
	Exclusive         = "exclusive"
	Timeslice         = "timeslice"
	MPS               = "mps"
	Priority          = "priority"
	ScriptedSuspend   = "scripted-suspend"
	ScriptedTimeslice = "scripted-timeslice"
	Arbiter           = "arbiter"
)

// ErrNeedsEngine is returned for the arbiter baseline while no
// Config.Arbiter controller is supplied (until the engine can run inside
// the simulator).
var ErrNeedsEngine = errors.New("baseline arbiter: not yet available: needs the engine (policy + engine in the loop)")

// Process describes a simulated process to a closed-loop controller: what a
// live engine learns from policy classification and the node inventory.
type Process struct {
	PID  uint32
	Name string
	// Group is the spec workload the process belongs to (replicas of one
	// LC workload share it).
	Group string
	Class sim.Class
	GPU   int
	// SLO is the LC workload's objective, nil if none.
	SLO *workload.SLO
}

// Controller closes the loop of a baseline: Run reads the source's events
// until it ends (returning nil) and enforces its decisions on the
// simulator. The source is also the controller's clock.
type Controller interface {
	Run() error
}

// ActionCounter is implemented by controllers that count their enforcement
// calls for the report.
type ActionCounter interface {
	Actions() report.Actions
}

// ControllerFunc builds the controller of a closed-loop baseline for one
// run. The arbiter baseline's will wrap the policy and engine packages:
// policy loaded from Config.PolicyDir, engine reading src and enforcing on
// enf.
type ControllerFunc func(src engine.DeadlineSource, enf engine.Enforcer, procs []Process) (Controller, error)

var descriptions = map[string]string{
	Exclusive:         "each workload alone on its GPU, default timeslice",
	Timeslice:         "all processes share by the driver's default round-robin time-slicing, equal timeslices",
	MPS:               "all kernels co-run (MPS-like spatial sharing) with the modelled slowdown",
	Priority:          "ideal priority: LC preempts BE the instant it has work, paying only the preemption cost",
	ScriptedSuspend:   "scripted closed loop: suspend BE channel groups while any LC request is active on the GPU",
	ScriptedTimeslice: "scripted closed loop: BE timeslice 100µs, LC 16ms with interleave high",
	Arbiter:           "Arbiter's policy and engine in the loop",
}

// Names lists every baseline in the order reports show them.
func Names() []string {
	return []string{Exclusive, Timeslice, MPS, Priority, ScriptedSuspend, ScriptedTimeslice, Arbiter}
}

// Config is one comparison.
type Config struct {
	// Name labels the report.
	Name string
	// Workloads are the processes; Options the GPU model (Mode and
	// Observe are set per baseline).
	Workloads []workload.Workload
	Options   sim.Options
	Seed      uint64
	Duration  time.Duration
	// Baselines to run, in order (default: exclusive, timeslice, mps,
	// priority). Ratios to exclusive need exclusive among them.
	Baselines []string
	// PolicyDir is the Rego policy directory of the arbiter baseline.
	PolicyDir string
	// Arbiter builds the arbiter baseline's controller (policy + engine in
	// the loop); nil makes that baseline fail with ErrNeedsEngine.
	Arbiter ControllerFunc
	// TimelineWindow records GPU timelines from 0 to this time.
	TimelineWindow time.Duration
	// Progress, if set, is called about every 1/100 of the duration of
	// each run with the baseline (and workload, for exclusive runs) and the
	// virtual time reached.
	Progress func(run string, now, end uint64)
}

// Run runs every baseline and returns the report. It stops at ctx's
// cancellation with ctx's error.
func Run(ctx context.Context, cfg *Config) (*report.Report, error) {
	if cfg.Duration <= 0 {
		return nil, fmt.Errorf("duration %v: must be positive", cfg.Duration)
	}
	if len(cfg.Workloads) == 0 {
		return nil, errors.New("no workloads")
	}
	names := cfg.Baselines
	if len(names) == 0 {
		names = []string{Exclusive, Timeslice, MPS, Priority}
	}
	for i, n := range names {
		if _, ok := descriptions[n]; !ok {
			return nil, fmt.Errorf("unknown baseline %q (known: %s)", n, strings.Join(Names(), ", "))
		}
		if slices.Contains(names[:i], n) {
			return nil, fmt.Errorf("baseline %q given twice", n)
		}
		if n == Arbiter && cfg.Arbiter == nil {
			return nil, ErrNeedsEngine
		}
	}
	resolved, err := cfg.Options.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("gpu model: %w", err)
	}
	rep := &report.Report{Workload: cfg.Name, Seed: cfg.Seed, DurationNS: uint64(cfg.Duration), GPUs: resolved.GPUs,
		Model: report.ModelOf(&resolved)}
	// Exclusive runs first so the others can be compared with it.
	order := slices.Clone(names)
	slices.SortStableFunc(order, func(a, b string) int {
		if a == Exclusive {
			return -1
		}
		if b == Exclusive {
			return 1
		}
		return 0
	})
	results := map[string]*report.Baseline{}
	var excl *report.Baseline
	for _, n := range order {
		var b *report.Baseline
		var err error
		if n == Exclusive {
			b, err = runExclusive(ctx, cfg)
		} else {
			b, err = runShared(ctx, cfg, n)
		}
		if err != nil {
			return nil, fmt.Errorf("baseline %s: %w", n, err)
		}
		b.Name, b.Description = n, descriptions[n]
		if n == Exclusive {
			excl = b
		}
		compare(b, excl)
		results[n] = b
	}
	for _, n := range names {
		rep.Baselines = append(rep.Baselines, *results[n])
	}
	return rep, nil
}

// runExclusive runs each spec workload (with all its replicas) alone.
func runExclusive(ctx context.Context, cfg *Config) (*report.Baseline, error) {
	agg := &report.Baseline{PIDs: map[uint32]string{}}
	var busy uint64
	for _, group := range groups(cfg.Workloads) {
		var ws []workload.Workload
		for _, w := range cfg.Workloads {
			if w.Group == group {
				ws = append(ws, w)
			}
		}
		opts := cfg.Options
		opts.Mode = sim.ModeTimeslice
		opts.TimelineWindow = 0
		s, err := sim.New(&opts)
		if err != nil {
			return nil, err
		}
		progs := workload.Programs(ws, cfg.Seed, uint64(cfg.Duration))
		for i := range ws {
			if _, err := s.Add(process(&ws[i], progs[i])); err != nil {
				return nil, err
			}
		}
		if err := run(ctx, s, cfg, Exclusive+"/"+group); err != nil {
			return nil, fmt.Errorf("workload %s alone: %w", group, err)
		}
		st := s.Stats()
		one := summarize(st, cfg, ws)
		agg.LC = append(agg.LC, one.LC...)
		agg.BE = append(agg.BE, one.BE...)
		agg.PreemptionsPerS += one.PreemptionsPerS
		agg.SwitchesPerS += one.SwitchesPerS
		agg.Kernels.Submitted += one.Kernels.Submitted
		agg.Kernels.Completed += one.Kernels.Completed
		agg.Kernels.InFlight += one.Kernels.InFlight
		for _, g := range st.GPUs {
			busy += g.Busy
		}
	}
	agg.GPUUtilization = float64(busy) / (float64(cfg.Duration) * float64(max(cfg.Options.GPUs, 1)))
	return agg, nil
}

// groups lists the spec workloads in order of first appearance.
func groups(ws []workload.Workload) []string {
	var out []string
	for _, w := range ws {
		if !slices.Contains(out, w.Group) {
			out = append(out, w.Group)
		}
	}
	return out
}

// runShared runs all workloads together under one baseline.
func runShared(ctx context.Context, cfg *Config, name string) (*report.Baseline, error) {
	opts := cfg.Options
	opts.TimelineWindow = cfg.TimelineWindow
	newCtl := controllerFor(cfg, name)
	switch name {
	case MPS:
		opts.Mode = sim.ModeSpatial
	case Priority:
		opts.Mode = sim.ModePriority
	}
	opts.Observe = newCtl != nil
	s, err := sim.New(&opts)
	if err != nil {
		return nil, err
	}
	var procs []Process
	progs := workload.Programs(cfg.Workloads, cfg.Seed, uint64(cfg.Duration))
	for i := range cfg.Workloads {
		w := &cfg.Workloads[i]
		pid, err := s.Add(process(w, progs[i]))
		if err != nil {
			return nil, err
		}
		procs = append(procs, Process{PID: pid, Name: w.Name, Group: w.Group, Class: w.Class, GPU: w.GPU, SLO: w.SLO})
	}
	var ctl Controller
	if newCtl != nil {
		src := &progressSource{Simulator: s, cfg: cfg, run: name, end: uint64(cfg.Duration)}
		if ctl, err = newCtl(src, s, procs); err != nil {
			return nil, err
		}
		s.Start(uint64(cfg.Duration))
		stop := context.AfterFunc(ctx, func() { s.Close() })
		err = ctl.Run()
		stop()
		if err == nil {
			err = s.Err()
		}
		if errors.Is(err, sim.ErrClosed) && ctx.Err() != nil {
			err = fmt.Errorf("simulation stopped at %v: %w", time.Duration(s.Now()), ctx.Err())
		}
	} else {
		err = run(ctx, s, cfg, name)
	}
	if err != nil {
		return nil, err
	}
	b := summarize(s.Stats(), cfg, cfg.Workloads)
	if ac, ok := ctl.(ActionCounter); ok {
		a := ac.Actions()
		b.Controller = &a
	}
	return b, nil
}

// controllerFor returns the controller constructor of a closed-loop
// baseline, nil for open-loop ones.
func controllerFor(cfg *Config, name string) ControllerFunc {
	switch name {
	case Arbiter:
		return cfg.Arbiter
	case ScriptedSuspend:
		return scriptedController(scripted.SuspendBE)
	case ScriptedTimeslice:
		return scriptedController(scripted.SplitTimeslice)
	}
	return nil
}

// scriptedController adapts a scripted policy to ControllerFunc.
func scriptedController(p scripted.Policy) ControllerFunc {
	return func(src engine.DeadlineSource, enf engine.Enforcer, procs []Process) (Controller, error) {
		var placed []scripted.Process
		for _, pr := range procs {
			placed = append(placed, scripted.Process{PID: pr.PID, LC: pr.Class == sim.ClassLC, GPU: pr.GPU})
		}
		c, err := scripted.New(src, enf, placed, &scripted.Options{Policy: p})
		if err != nil {
			return nil, err
		}
		return scriptedRunner{c}, nil
	}
}

// scriptedRunner reports a scripted controller's actions.
type scriptedRunner struct{ *scripted.Controller }

// Actions implements ActionCounter.
func (r scriptedRunner) Actions() report.Actions {
	st := r.Stats()
	return report.Actions{Events: st.Events, Suspends: st.Suspends, Resumes: st.Resumes,
		Timeslices: st.Timeslices, Interleaves: st.Interleaves}
}

func process(w *workload.Workload, prog sim.Program) sim.Process {
	return sim.Process{Name: w.Name, Class: w.Class, GPU: w.GPU, Program: prog, Interleave: engine.InterleaveMedium}
}

func run(ctx context.Context, s *sim.Simulator, cfg *Config, name string) error {
	var progress func(uint64)
	if cfg.Progress != nil {
		progress = func(now uint64) { cfg.Progress(name, now, uint64(cfg.Duration)) }
	}
	return s.RunProgress(ctx, uint64(cfg.Duration), cfg.Duration/100, progress)
}

// progressSource reports progress while a controller reads the simulator.
type progressSource struct {
	*sim.Simulator
	cfg  *Config
	run  string
	end  uint64
	next uint64
}

// Read reads from the simulator and reports progress.
func (p *progressSource) Read(ev *trace.Event) error {
	err := p.Simulator.Read(ev)
	if p.cfg.Progress != nil && p.Now() >= p.next {
		p.cfg.Progress(p.run, p.Now(), p.end)
		p.next = p.Now() + p.end/100
	}
	return err
}

// summarize turns a run's statistics into a report baseline.
func summarize(st sim.Stats, cfg *Config, ws []workload.Workload) *report.Baseline {
	secs := cfg.Duration.Seconds()
	b := &report.Baseline{Timeline: st.Timeline, PIDs: map[uint32]string{}}
	var busy uint64
	d := float64(cfg.Duration)
	for i, g := range st.GPUs {
		busy += g.Busy
		b.PreemptionsPerS += float64(g.Preemptions) / secs
		b.SwitchesPerS += float64(g.Switches) / secs
		b.PerGPU = append(b.PerGPU, report.GPU{Index: i, Utilization: float64(g.Busy) / d,
			SwitchShare: float64(g.SwitchTime) / d, PreemptShare: float64(g.PreemptTime) / d,
			PreemptionsPerS: float64(g.Preemptions) / secs, SwitchesPerS: float64(g.Switches) / secs})
	}
	b.GPUUtilization = float64(busy) / (float64(cfg.Duration) * float64(len(st.GPUs)))
	lcs := map[string]*lcGroup{}
	var lcOrder []string
	for i, p := range st.Procs {
		w := &ws[i]
		b.PIDs[p.PID] = p.Name
		b.Kernels.Submitted += p.KernelsSubmitted
		b.Kernels.Completed += p.KernelsCompleted
		b.Kernels.InFlight += p.KernelsInFlight
		if p.Class == sim.ClassLC {
			g := lcs[w.Group]
			if g == nil {
				g = &lcGroup{w: w, gpu: p.GPU}
				lcs[w.Group] = g
				lcOrder = append(lcOrder, w.Group)
			}
			g.lat.Merge(p.Latency)
			g.requests += p.Requests
			g.inFlight += p.RequestsBegun - p.Requests
			continue
		}
		b.BE = append(b.BE, report.BE{Name: p.Name, GPU: p.GPU, Kernels: p.KernelsCompleted,
			Throughput: float64(p.CompletedWork) / float64(cfg.Duration), Preempted: p.Preempted})
	}
	for _, name := range lcOrder {
		b.LC = append(b.LC, lcs[name].result())
	}
	return b
}

// lcGroup gathers the replicas of one LC workload.
type lcGroup struct {
	w                  *workload.Workload
	gpu                int
	lat                hist.Histogram
	requests, inFlight uint64
}

func (g *lcGroup) result() report.LC {
	h, w := &g.lat, g.w
	l := report.LC{Name: w.Group, GPU: g.gpu, Requests: g.requests, InFlight: g.inFlight,
		MeanNS: h.Mean(), P50NS: h.Quantile(0.5), P99NS: h.Quantile(0.99), P999NS: h.Quantile(0.999), MaxNS: h.Max(),
		CDF: h.CDF(200), Latency: h}
	if l.CDF == nil {
		l.CDF = []hist.Point{}
	}
	if w.SLO != nil {
		l.SLOTargetNS = uint64(w.SLO.Target)
		l.SLOPercentile = w.SLO.Percentile
		if l.SLOPercentile == 0 {
			l.SLOPercentile = 99
		}
		if h.Count() > 0 {
			l.Attainment = float64(h.AtOrBelow(l.SLOTargetNS)) / float64(h.Count())
		}
		l.SLOMet = h.Count() > 0 && 100*l.Attainment >= l.SLOPercentile
	}
	return l
}

// compare fills in the ratios to the exclusive baseline.
func compare(b, excl *report.Baseline) {
	if excl == nil {
		return
	}
	div := func(a, b uint64) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	for i := range b.LC {
		for _, e := range excl.LC {
			if e.Name == b.LC[i].Name {
				b.LC[i].P50Ratio = div(b.LC[i].P50NS, e.P50NS)
				b.LC[i].P99Ratio = div(b.LC[i].P99NS, e.P99NS)
				b.LC[i].P999Ratio = div(b.LC[i].P999NS, e.P999NS)
			}
		}
	}
	for i := range b.BE {
		for _, e := range excl.BE {
			if e.Name == b.BE[i].Name && e.Throughput > 0 {
				b.BE[i].Fraction = b.BE[i].Throughput / e.Throughput
			}
		}
	}
}
