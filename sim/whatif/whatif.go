// Package whatif runs one workload under several baselines with the same
// seed and compares them: exclusive (each workload alone), the driver's
// default time-slicing, MPS-like spatial sharing, per-kernel and
// request-aware ideal priority, wait-based priority, the GPreempt preset,
// scripted closed-loop policies, and baselines the caller supplies (the
// real policy and engine in the loop, once they can run there).
//
// The runs are independent simulations: they run concurrently, and the
// report is assembled in baseline order, so it is the same, byte for
// byte, however many run at once.
package whatif

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/workload"
)

// ErrNeedsPolicy is returned for the arbiter baseline when no Extra
// baseline of that name is supplied: the caller builds it from a policy
// (`arbiter sim --policy DIR` does).
var ErrNeedsPolicy = errors.New("baseline arbiter: needs a policy: give the policy directory (arbiter sim --policy DIR)")

// DefaultControlLatency is the closed-loop baselines' driver control
// latency unless the model sets one: the best measurement there is of
// taking a process's channel groups off a GPU, Arbiter's suspend with
// FIFO_DISABLE_CHANNELS on an H100 (GSP firmware, driver 580.159.04),
// whose kernel had stopped by the time the call returned: p50 615 µs, p99
// 815 µs over 100 trials (docs/gpu-validation.md, 2026-11-25). Replace it
// with a measurement of your GPU (scripts/gpu-validate.sh, section nvrm).
const DefaultControlLatency = 615 * time.Microsecond

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
	// Labels and Env are the spec's, for a policy to classify by.
	Labels, Env map[string]string
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

// Classifier is implemented by controllers that classify processes
// themselves (a policy): the report shows, for their baseline, the class
// each process was given instead of the spec's.
type Classifier interface {
	// Class returns the class name given to pid ("lc", "be", or a
	// policy's own class name), false if the process was not classified.
	Class(pid uint32) (string, bool)
}

// ControllerFunc builds the controller of a closed-loop baseline for one
// run. The arbiter baseline's wraps the engine (EngineController) with a
// policy's classifier: the caller loads the policy (arbiter sim --policy).
type ControllerFunc func(src engine.DeadlineSource, enf engine.Enforcer, procs []Process) (Controller, error)

// Config is one comparison.
type Config struct {
	// Name labels the report.
	Name string
	// Workloads are the processes; Options the GPU model (Mode, Observe
	// and, for some baselines, Granularity are set per baseline).
	Workloads []workload.Workload
	Options   sim.Options
	// ControlLatency is the closed-loop baselines' control latency; nil
	// means DefaultControlLatency (Options.ControlLatency is not used:
	// open-loop baselines make no control calls).
	ControlLatency *time.Duration
	Seed           uint64
	Duration       time.Duration
	// Baselines to run, in order (default: DefaultBaselines). Ratios to
	// exclusive need exclusive among them.
	Baselines []string
	// Extra are closed-loop baselines supplied by the caller, run when
	// named in Baselines.
	Extra []Extra
	// TimelineWindow records GPU timelines from 0 to this time.
	TimelineWindow time.Duration
	// Parallel is how many simulations run at once (0: all of them, on
	// GOMAXPROCS threads, kept within a second of simulated time of each
	// other, while that leaves no thread idle, so that they share the
	// service times they draw).
	Parallel int
	// Progress, if set, is called with the comparison's progress about
	// every 16,384 simulated events of each run, never concurrently.
	Progress func(Progress)
}

// controlLatency resolves ControlLatency.
func (c *Config) controlLatency() time.Duration {
	if c.ControlLatency != nil {
		return *c.ControlLatency
	}
	return DefaultControlLatency
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
	bases, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	resolved, err := cfg.Options.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("gpu model: %w", err)
	}
	if cl := cfg.controlLatency(); cl < 0 || cl > time.Hour {
		return nil, fmt.Errorf("control latency %v: must be between 0 and 1h", cl)
	}
	rep := &report.Report{Workload: cfg.Name, Seed: cfg.Seed, DurationNS: uint64(cfg.Duration), GPUs: resolved.GPUs,
		Model: report.ModelOf(&resolved)}
	for _, b := range bases {
		if b.controller != nil {
			rep.Model.ControlLatencyNS = uint64(cfg.controlLatency())
			rep.Model.ControlLatencySource = controlLatencySource(cfg)
			break
		}
	}
	jobs := plan(cfg, bases)
	parallel := cfg.Parallel
	if parallel <= 0 {
		parallel = len(jobs)
	}
	if err := runAll(ctx, cfg, jobs, parallel, newTracker(cfg, bases, jobs, parallel)); err != nil {
		return nil, err
	}
	results := assemble(cfg, bases, jobs)
	var excl *report.Baseline
	for i := range results {
		if bases[i].name == Exclusive {
			excl = results[i]
		}
	}
	for i, b := range results {
		b.Name, b.Description = bases[i].name, bases[i].description
		compare(b, excl)
		rep.Baselines = append(rep.Baselines, *b)
	}
	return rep, nil
}

// controlLatencySource says where the closed loop's control latency came
// from, for the report.
func controlLatencySource(cfg *Config) string {
	if cfg.ControlLatency != nil {
		return "model.control_latency"
	}
	return "default: suspend measured on an H100, FIFO_DISABLE_CHANNELS p50 615µs"
}
