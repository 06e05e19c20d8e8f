package workload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Spec is a workload file.
type Spec struct {
	// Name labels reports (default: the file name).
	Name string `json:"name,omitempty"`
	// GPUs is the number of GPUs of the node (required, 1–1024).
	GPUs int `json:"gpus"`
	// Duration is the default simulated time of a run.
	Duration Duration `json:"duration,omitempty"`
	// Model overrides the GPU model's defaults.
	Model *Model `json:"model,omitempty"`
	// LC and BE are the generated workloads; Replay the recorded ones.
	LC     []LC     `json:"lc,omitempty"`
	BE     []BE     `json:"be,omitempty"`
	Replay []Replay `json:"replay,omitempty"`
}

// Model overrides sim.Options fields; omitted ones keep their defaults
// (0 also means the default, except for ControlLatency, where an explicit
// 0s means controls take effect at once).
type Model struct {
	Timeslice       Duration `json:"timeslice,omitempty"`
	ContextSwitch   Duration `json:"context_switch,omitempty"`
	Preemption      Duration `json:"preemption,omitempty"`
	Granularity     string   `json:"granularity,omitempty"` // instruction, block, kernel
	BlockDrain      Duration `json:"block_drain,omitempty"`
	SpatialSlowdown float64  `json:"spatial_slowdown,omitempty"`
	CopyBandwidth   float64  `json:"copy_bandwidth,omitempty"` // bytes/s
	CopyLatency     Duration `json:"copy_latency,omitempty"`
	// ControlLatency applies to the closed-loop baselines (open-loop ones
	// make no control calls); omitted: whatif.DefaultControlLatency.
	ControlLatency *Duration `json:"control_latency,omitempty"`
}

// SLO is an LC workload's latency objective.
type SLO struct {
	// Target is the latency a request should meet.
	Target Duration `json:"target"`
	// Percentile is the share of requests (0–100, exclusive) that must meet
	// it (default 99).
	Percentile float64 `json:"percentile,omitempty"`
}

// LC is a latency-critical request stream served one request at a time by
// each of its replicas (requests that arrive while all are busy wait in a
// queue; their latency includes the wait).
type LC struct {
	Name    string  `json:"name"`
	GPU     int     `json:"gpu"`
	SLO     *SLO    `json:"slo,omitempty"`
	Arrival Arrival `json:"arrival"`
	Request []Step  `json:"request"`
	// MaxPending bounds the requests waiting to be served (default
	// 100000): later arrivals are turned away, as by a server with a
	// bounded queue, and counted as rejected (and as SLO misses).
	MaxPending int `json:"max_pending,omitempty"`
	// Replicas is the number of server processes (default 1, at most 64),
	// each its own CUDA process with its own channel group on GPU, taking
	// requests from one shared queue as they become idle.
	Replicas int `json:"replicas,omitempty"`
	// Labels and Env are what a policy sees of the process in the arbiter
	// baseline: its pod's labels and its ARBITER_* environment variables.
	Labels map[string]string `json:"labels,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
}

// Arrival is how requests arrive.
type Arrival struct {
	// Process is poisson, lognormal, periodic, uniform, trace or closed.
	Process string `json:"process"`
	// Rate is the mean arrival rate in requests/s (poisson, lognormal,
	// periodic).
	Rate float64 `json:"rate,omitempty"`
	// Sigma is the log-normal inter-arrival shape (default 1).
	Sigma float64 `json:"sigma,omitempty"`
	// Min and Max bound the inter-arrival times of process uniform, drawn
	// uniformly between them (a client pacing its requests with jitter).
	Min Duration `json:"min,omitempty"`
	Max Duration `json:"max,omitempty"`
	// Times are recorded arrival offsets from the start (trace), or File
	// names a text file of them, one duration per line ('#' comments),
	// relative to the spec's directory.
	Times []Duration `json:"times,omitempty"`
	File  string     `json:"file,omitempty"`
	// Think is, for process closed, the time between the end of a
	// server's request and the arrival of its next one (default 0): each
	// replica is a client that sends its next request only when its
	// previous one is done, as a benchmark loop or a training job does.
	Think *Dist `json:"think,omitempty"`

	// given holds the fields the spec wrote, 0 or not, so that one that
	// does not apply to the process is refused even where it is 0.
	given map[string]bool
}

// UnmarshalJSON decodes an arrival, noting which fields were written.
func (a *Arrival) UnmarshalJSON(b []byte) error {
	type plain Arrival
	var p plain
	if err := decodeStrict(b, &p); err != nil {
		return err
	}
	*a = Arrival(p)
	a.given = keysOf(b)
	return nil
}

// decodeStrict decodes the JSON b into v, refusing unknown fields.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// keysOf returns the keys of the JSON object b (nil where b is not one),
// but those whose value is null: as everywhere in a spec, a null is a
// field not written.
func keysOf(b []byte) map[string]bool {
	var fields map[string]json.RawMessage
	if json.Unmarshal(b, &fields) != nil {
		return nil
	}
	keys := make(map[string]bool, len(fields))
	for k, v := range fields {
		if string(bytes.TrimSpace(v)) != "null" {
			keys[k] = true
		}
	}
	return keys
}

// Step is one part of a request: exactly one field is set.
type Step struct {
	Copy   *CopyStep   `json:"copy,omitempty"`
	Kernel *KernelStep `json:"kernel,omitempty"`
	Sync   *struct{}   `json:"sync,omitempty"`
	Host   *HostStep   `json:"host,omitempty"`
}

// CopyStep is an asynchronous copy.
type CopyStep struct {
	Dir   string `json:"dir"` // h2d or d2h
	Bytes uint64 `json:"bytes"`
}

// KernelStep launches Count kernels (default 1) with durations drawn from
// Duration; with SyncEach the host synchronizes after each.
type KernelStep struct {
	Count    int  `json:"count,omitempty"`
	Duration Dist `json:"duration"`
	SyncEach bool `json:"sync_each,omitempty"`
}

// HostStep is CPU work on the host between GPU operations.
type HostStep struct {
	Duration Dist `json:"duration"`
}

// BE is a best-effort stream: kernels back to back, a synchronization every
// SyncEvery kernels (default 1), then HostGap of CPU work.
type BE struct {
	Name      string `json:"name"`
	GPU       int    `json:"gpu"`
	Kernel    Dist   `json:"kernel"`
	SyncEvery int    `json:"sync_every,omitempty"`
	HostGap   *Dist  `json:"host_gap,omitempty"`
	// Labels and Env are what a policy sees of the process in the arbiter
	// baseline: its pod's labels and its ARBITER_* environment variables.
	Labels map[string]string `json:"labels,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
}

// Replay plays processes of a recorded trace.
type Replay struct {
	// File is the trace, relative to the spec's directory.
	File      string          `json:"file"`
	Processes []ReplayProcess `json:"processes"`
}

// ReplayProcess selects one recorded process by PID or Comm and says how to
// simulate it.
type ReplayProcess struct {
	PID   uint32 `json:"pid,omitempty"`
	Comm  string `json:"comm,omitempty"`
	Name  string `json:"name"`
	Class string `json:"class"` // lc or be
	GPU   int    `json:"gpu"`
	SLO   *SLO   `json:"slo,omitempty"`
	// Labels and Env are what a policy sees of the process in the arbiter
	// baseline: its pod's labels and its ARBITER_* environment variables.
	Labels map[string]string `json:"labels,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
	// RequestGap is the idle gap that separates LC requests (default
	// trace.DefaultIdleGap).
	RequestGap Duration `json:"request_gap,omitempty"`
	// RequestEnd is "gap" (default: a request is a busy period, ended by
	// the last blocking synchronization before an idle gap of RequestGap)
	// or "sync" (every blocking synchronization ends a request, for
	// servers that synchronize once per request and may work through a
	// backlog back to back).
	RequestEnd string `json:"request_end,omitempty"`
}

// Duration is a time.Duration written as a string with a unit ("250us",
// "1.5ms", "20s"); bare numbers are rejected because their unit would be a
// guess.
type Duration time.Duration

// UnmarshalJSON parses a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // not written, as everywhere in a spec
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string with a unit such as \"250us\", got %s", b)
	}
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func parseDuration(s string) (time.Duration, error) {
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("bad duration %s: want a number with a unit such as \"250us\"", quote(s))
	}
	return v, nil
}

// Dist is a duration distribution: a bare duration string means constant;
// the object form names the distribution (const, exp, lognormal, uniform)
// with its Mean, CV (coefficient of variation, lognormal) or Min/Max
// (uniform). Min and Max, where given, also clamp the other distributions.
type Dist struct {
	Dist string   `json:"dist,omitempty"`
	Mean Duration `json:"mean,omitempty"`
	CV   float64  `json:"cv,omitempty"`
	Min  Duration `json:"min,omitempty"`
	Max  Duration `json:"max,omitempty"`
	// bare is set where the spec gave a duration alone ("5ms"), for
	// messages to quote it as written.
	bare bool
	// givenMean and givenCV are set where the spec wrote mean or cv, 0 or
	// not, so that one the distribution does not take is refused even
	// where it is 0.
	givenMean, givenCV bool
}

// UnmarshalJSON accepts the string shorthand or the object form.
func (d *Dist) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var v Duration
		if err := v.UnmarshalJSON(b); err != nil {
			return err
		}
		*d = Dist{Dist: "const", Mean: v, bare: true}
		return nil
	}
	type plain Dist
	var p plain
	if err := decodeStrict(b, &p); err != nil {
		return err
	}
	*d = Dist(p)
	keys := keysOf(b)
	d.givenMean, d.givenCV = keys["mean"], keys["cv"]
	return nil
}

// scalarForm marks types whose YAML may also be a plain scalar.
func (Dist) scalarForm() {}
