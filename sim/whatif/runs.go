package whatif

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/workload"
)

// job is one simulation: a shared baseline, or one spec workload (with
// its replicas) alone for the exclusive baseline.
type job struct {
	base  int // index of its baseline
	b     *baseline
	group string // exclusive: the spec workload it runs alone
	ws    []workload.Workload
	cost  int // rough relative cost, to start the longest first

	out  *report.Baseline
	busy uint64 // exclusive: compute-engine busy time, all GPUs
	err  error
}

// plan lists the simulations of a comparison.
func plan(cfg *Config, bases []baseline) []*job {
	var jobs []*job
	for i := range bases {
		b := &bases[i]
		if b.name != Exclusive {
			cost := 2
			if b.controller != nil {
				cost = 3
			}
			jobs = append(jobs, &job{base: i, b: b, ws: cfg.Workloads, cost: cost})
			continue
		}
		for _, g := range groups(cfg.Workloads) {
			var ws []workload.Workload
			for _, w := range cfg.Workloads {
				if w.Group == g {
					ws = append(ws, w)
				}
			}
			jobs = append(jobs, &job{base: i, b: b, group: g, ws: ws, cost: 1})
		}
	}
	return jobs
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

// runAll runs the jobs, parallel at a time, costliest first. The first
// failure stops the others; the error returned is the first failure in
// job order that is not a consequence of stopping, so it does not depend
// on timing.
func runAll(ctx context.Context, cfg *Config, jobs []*job, parallel int, tr *tracker) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(ctx, tr.stop)()
	draws := workload.NewDraws()
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(jobs[b].cost, jobs[a].cost) })
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(parallel, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				j.err = runJob(ctx, cfg, j, draws, tr.forJob(i))
				tr.finish(i)
				if j.err != nil {
					cancel()
				}
			}
		}()
	}
feed:
	for _, i := range order {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	var first error
	for _, j := range jobs {
		if j.err == nil {
			continue
		}
		err := fmt.Errorf("baseline %s: %w", j.b.name, j.err)
		if j.group != "" {
			err = fmt.Errorf("baseline %s: workload %s alone: %w", j.b.name, j.group, j.err)
		}
		if !errors.Is(j.err, context.Canceled) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = ctx.Err()
	}
	if first == nil && slices.ContainsFunc(jobs, func(j *job) bool { return j.out == nil }) {
		first = errors.New("comparison stopped before every run finished")
	}
	return first
}

// runJob runs one simulation and summarizes it.
func runJob(ctx context.Context, cfg *Config, j *job, draws *workload.Draws, progress func(now uint64)) error {
	opts := j.b.options(cfg)
	if j.group != "" {
		opts.TimelineWindow = 0
	} else {
		opts.TimelineWindow = cfg.TimelineWindow
	}
	var newCtl ControllerFunc
	if j.b.controller != nil {
		newCtl = j.b.controller(cfg)
	}
	opts.Observe = newCtl != nil
	s, err := sim.New(&opts)
	if err != nil {
		return err
	}
	end := uint64(cfg.Duration)
	progs := workload.Programs(j.ws, cfg.Seed, end, draws)
	var procs []Process
	for i := range j.ws {
		w := &j.ws[i]
		p := sim.Process{Name: w.Name, Class: w.Class, GPU: w.GPU, Program: progs[i]}
		if j.b.timeslice != nil {
			p.Timeslice = j.b.timeslice(w.Class)
		}
		pid, err := s.Add(p)
		if err != nil {
			return err
		}
		procs = append(procs, Process{PID: pid, Name: w.Name, Group: w.Group, Class: w.Class, GPU: w.GPU, SLO: w.SLO, Labels: w.Labels, Env: w.Env})
	}
	var ctl Controller
	if newCtl != nil {
		s.ReadProgress(progress)
		if ctl, err = newCtl(s, s, procs); err != nil {
			return err
		}
		s.Start(end)
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
		err = s.RunProgress(ctx, end, progress)
	}
	if err != nil {
		return err
	}
	st := s.Stats()
	j.out = summarize(st, cfg, j.ws, backlogOf(j.ws, progs, end))
	for _, g := range st.GPUs {
		j.busy += g.Busy
	}
	if ac, ok := ctl.(ActionCounter); ok {
		a := ac.Actions()
		j.out.Controller = &a
	}
	if cl, ok := ctl.(Classifier); ok {
		classify(j.out, procs, cl)
	}
	return nil
}

// backlog is what an LC workload left unserved at the end: the arrival
// times of the requests no server had begun, and how many were turned
// away.
type backlog struct {
	waiting  []uint64
	rejected uint64
}

// backlogOf collects every LC workload's backlog (asked of one replica:
// they share the queue).
func backlogOf(ws []workload.Workload, progs []sim.Program, end uint64) map[string]*backlog {
	out := map[string]*backlog{}
	for i := range ws {
		g := ws[i].Group
		if _, done := out[g]; done || ws[i].Class != sim.ClassLC {
			continue
		}
		b := &backlog{}
		b.rejected, _ = workload.Waiting(progs[i], end, func(a uint64) { b.waiting = append(b.waiting, a) })
		out[g] = b
	}
	return out
}

// assemble puts the jobs' results together per baseline, in baseline
// order; the exclusive baseline's solo runs in spec order.
func assemble(cfg *Config, bases []baseline, jobs []*job) []*report.Baseline {
	out := make([]*report.Baseline, len(bases))
	busy := make([]uint64, len(bases))
	for _, j := range jobs {
		if j.group == "" {
			out[j.base] = j.out
			continue
		}
		agg := out[j.base]
		if agg == nil {
			agg = &report.Baseline{PIDs: map[uint32]string{}}
			out[j.base] = agg
		}
		agg.LC = append(agg.LC, j.out.LC...)
		agg.BE = append(agg.BE, j.out.BE...)
		agg.PreemptionsPerS += j.out.PreemptionsPerS
		agg.SwitchesPerS += j.out.SwitchesPerS
		agg.Kernels.Submitted += j.out.Kernels.Submitted
		agg.Kernels.Completed += j.out.Kernels.Completed
		agg.Kernels.InFlight += j.out.Kernels.InFlight
		busy[j.base] += j.busy
	}
	for i := range bases {
		if bases[i].name == Exclusive {
			out[i].GPUUtilization = float64(busy[i]) / (float64(cfg.Duration) * float64(max(cfg.Options.GPUs, 1)))
		}
	}
	return out
}
