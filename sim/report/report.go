// Package report holds the outcome of a what-if comparison: per baseline,
// LC latency and SLO attainment, BE throughput, preemptions and GPU
// utilization. It writes it as a text table, as deterministic JSON and as
// SVG plots (latency CDFs, GPU timelines).
package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/hist"
)

// Report compares baselines on one workload. Its JSON form holds no
// wall-clock time, so the same inputs give the same bytes.
type Report struct {
	Workload   string     `json:"workload"`
	Seed       uint64     `json:"seed"`
	DurationNS uint64     `json:"duration_ns"`
	GPUs       int        `json:"gpus"`
	Model      Model      `json:"model"`
	Baselines  []Baseline `json:"baselines"`
}

// Model records the GPU model parameters the run used.
type Model struct {
	TimesliceNS     uint64  `json:"timeslice_ns"`
	ContextSwitchNS uint64  `json:"context_switch_ns"`
	PreemptionNS    uint64  `json:"preemption_ns"`
	Granularity     string  `json:"granularity"`
	BlockDrainNS    uint64  `json:"block_drain_ns"`
	SpatialSlowdown float64 `json:"spatial_slowdown"`
	CopyBandwidth   float64 `json:"copy_bandwidth"`
	CopyLatencyNS   uint64  `json:"copy_latency_ns"`
	// ControlLatencyNS is the closed-loop baselines' control latency and
	// ControlLatencySource where it came from (both empty when no
	// closed-loop baseline ran).
	ControlLatencyNS     uint64 `json:"control_latency_ns"`
	ControlLatencySource string `json:"control_latency_source,omitempty"`
}

// ModelOf records resolved simulator options (the control latency is the
// caller's to fill in: it applies to closed-loop baselines only).
func ModelOf(o *sim.Options) Model {
	return Model{
		TimesliceNS: uint64(o.Timeslice), ContextSwitchNS: uint64(o.ContextSwitch), PreemptionNS: uint64(o.Preemption),
		Granularity: o.Granularity.String(), BlockDrainNS: uint64(o.BlockDrain), SpatialSlowdown: o.SpatialSlowdown,
		CopyBandwidth: o.CopyBandwidth, CopyLatencyNS: uint64(o.CopyLatency),
	}
}

// Baseline is one way of sharing the GPUs and what it gave.
type Baseline struct {
	Name string `json:"name"`
	// Description says what the baseline models.
	Description string `json:"description"`
	LC          []LC   `json:"lc"`
	BE          []BE   `json:"be"`
	// PreemptionsPerS counts kernels saved mid-flight per simulated second
	// (all GPUs); SwitchesPerS context loads.
	PreemptionsPerS float64 `json:"preemptions_per_s"`
	SwitchesPerS    float64 `json:"switches_per_s"`
	// GPUUtilization is the compute engines' busy share over all GPUs.
	// For exclusive it is the sum of the solo runs' busy time over GPUs ×
	// duration: the load the workloads offer (above 1: more than the node
	// can serve), each solo run counting at most its GPU's whole time.
	GPUUtilization float64 `json:"gpu_utilization"`
	// PerGPU breaks utilization and preemptions down by GPU (not for
	// exclusive, which runs each workload on its own).
	PerGPU []GPU `json:"per_gpu,omitempty"`
	// Kernels accounts for every kernel submitted.
	Kernels Conservation `json:"kernels"`
	// Controller counts the scripted controller's actions (closed-loop
	// baselines only).
	Controller *Actions `json:"controller,omitempty"`

	// Timeline is the GPU timeline window (not in JSON; see the SVG).
	Timeline []sim.Segment `json:"-"`
	// PIDs maps pids to workload names for the timeline.
	PIDs map[uint32]string `json:"-"`
}

// GPU is one GPU's share of a baseline's figures.
type GPU struct {
	Index int `json:"index"`
	// Utilization is the compute engine's busy share; SwitchShare and
	// PreemptShare the shares spent loading and saving contexts.
	Utilization     float64 `json:"utilization"`
	SwitchShare     float64 `json:"switch_share"`
	PreemptShare    float64 `json:"preempt_share"`
	PreemptionsPerS float64 `json:"preemptions_per_s"`
	SwitchesPerS    float64 `json:"switches_per_s"`
}

// Actions counts enforcement calls of a closed-loop baseline.
type Actions struct {
	Events      uint64 `json:"events"`
	Suspends    uint64 `json:"suspends"`
	Resumes     uint64 `json:"resumes"`
	Timeslices  uint64 `json:"timeslices"`
	Interleaves uint64 `json:"interleaves"`
}

// Conservation shows no kernel was lost: Submitted = Completed + InFlight.
type Conservation struct {
	Submitted uint64 `json:"submitted"`
	Completed uint64 `json:"completed"`
	InFlight  uint64 `json:"in_flight"`
}

// LC is one latency-critical workload's outcome. Every request that
// arrived before the end is counted: Arrived = Requests + InFlight +
// Waiting + Rejected.
type LC struct {
	Name string `json:"name"`
	GPU  int    `json:"gpu"`
	// Class is the class the baseline treated the workload as: "lc", or
	// the class a closed-loop controller's policy gave it.
	Class string `json:"class"`
	// Arrived counts requests that arrived before the end; Requests those
	// completed; InFlight those begun and not finished; Waiting those no
	// server had begun; Rejected those turned away because max_pending
	// requests were already waiting.
	Arrived  uint64 `json:"arrived"`
	Requests uint64 `json:"requests"`
	InFlight uint64 `json:"in_flight"`
	Waiting  uint64 `json:"waiting"`
	Rejected uint64 `json:"rejected,omitempty"`
	// OldestUnservedNS is the age at the end of the oldest request in
	// flight or waiting.
	OldestUnservedNS uint64 `json:"oldest_unserved_ns,omitempty"`
	// Backlog flags a run that turned requests away or ended with
	// requests older than the SLO target (without one: than the completed
	// requests' p99) still unserved: a server that could not keep up or
	// was starved. Then the latency figures count the unserved requests
	// at their age at the end, so they are lower bounds (LowerBound), and
	// UnservedLate of them, and the rejected ones, count as SLO misses.
	Backlog      bool   `json:"backlog,omitempty"`
	LowerBound   bool   `json:"lower_bound,omitempty"`
	UnservedLate uint64 `json:"unserved_late,omitempty"`
	// Latencies in ns (p50, p99, p99.9 nearest-rank, within 0.4%), over
	// completed requests (and unserved ones, see Backlog); 0, and absent
	// from JSON, when none: no latency, not a latency of 0.
	MeanNS float64 `json:"mean_ns,omitempty"`
	P50NS  uint64  `json:"p50_ns,omitempty"`
	P99NS  uint64  `json:"p99_ns,omitempty"`
	P999NS uint64  `json:"p999_ns,omitempty"`
	MaxNS  uint64  `json:"max_ns,omitempty"`
	// P50Ratio, P99Ratio and P999Ratio compare with the exclusive baseline
	// (0, and absent from JSON, when it was not run or has no latency).
	P50Ratio  float64 `json:"p50_ratio,omitempty"`
	P99Ratio  float64 `json:"p99_ratio,omitempty"`
	P999Ratio float64 `json:"p999_ratio,omitempty"`
	// SLOTargetNS and SLOPercentile are the workload's objective (0: none);
	// Attainment is the share of judged requests within target (SLOJudged:
	// the completed ones plus the unserved ones already past the target;
	// 0 when none), SLOMet whether it reaches the percentile.
	SLOTargetNS   uint64  `json:"slo_target_ns,omitempty"`
	SLOPercentile float64 `json:"slo_percentile,omitempty"`
	SLOJudged     uint64  `json:"slo_judged,omitempty"`
	Attainment    float64 `json:"slo_attainment,omitempty"`
	SLOMet        bool    `json:"slo_met,omitempty"`
	// CDF is the latency distribution, thinned.
	CDF []hist.Point `json:"cdf"`

	// Latency is the full histogram (not in JSON).
	Latency *hist.Histogram `json:"-"`
}

// BE is one best-effort workload's outcome.
type BE struct {
	Name string `json:"name"`
	GPU  int    `json:"gpu"`
	// Class is the class the baseline treated the workload as ("be", or a
	// controller's policy's class).
	Class string `json:"class"`
	// Kernels completed; Throughput is the kernel work done (exclusive
	// GPU-seconds, the partial progress of kernels still running at the
	// end included) per simulated second; Fraction compares it with the
	// exclusive baseline: nil (absent) when that was not run or did no
	// work, 0 for a workload the baseline starved.
	Kernels    uint64   `json:"kernels"`
	Throughput float64  `json:"throughput"`
	Fraction   *float64 `json:"fraction_of_exclusive,omitempty"`
	Preempted  uint64   `json:"preempted"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}
