package web

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
)

// StatusView is the body of GET /status.
type StatusView struct {
	Node          Node      `json:"node"`
	Version       string    `json:"version"`
	StartedAt     time.Time `json:"started_at"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	Ready         bool      `json:"ready"`
	// EngineTime is the engine's clock at the snapshot (ns, the event
	// source's timebase): the unit of ?since= on /decisions.
	EngineTime       uint64        `json:"engine_time"`
	Engine           StatsView     `json:"engine"`
	Policy           *PolicyStatus `json:"policy"`
	Counts           Counts        `json:"counts"`
	DecisionsTotal   uint64        `json:"decisions_total"`
	PreemptionsTotal uint64        `json:"preemptions_total"`
}

// StatsView is the engine's counters.
type StatsView struct {
	Events          uint64 `json:"events"`
	Processes       uint64 `json:"processes"`
	Classifications uint64 `json:"classifications"`
	ClassifyErrors  uint64 `json:"classify_errors"`
	Requests        uint64 `json:"requests"`
	Suspends        uint64 `json:"suspends"`
	Resumes         uint64 `json:"resumes"`
	Gates           uint64 `json:"gates"`
	Ungates         uint64 `json:"ungates"`
	Timeslices      uint64 `json:"timeslices"`
	Interleaves     uint64 `json:"interleaves"`
	EnforceErrors   uint64 `json:"enforce_errors"`
	VictimCalls     uint64 `json:"victim_calls"`
	VictimErrors    uint64 `json:"victim_errors"`
	Escalations     uint64 `json:"escalations"`
	Relaxes         uint64 `json:"relaxes"`
	HarvestsSkipped uint64 `json:"harvests_skipped"`
	Arms            uint64 `json:"arms"`
}

// Counts are the processes by class, state and level.
type Counts struct {
	Processes int                       `json:"processes"`
	Unmanaged int                       `json:"unmanaged"`
	States    map[string]int            `json:"states"`
	Levels    map[string]int            `json:"levels"`
	Classes   map[string]map[string]int `json:"classes"` // class -> state -> processes
}

// ProcessItem is one process as /processes shows it.
type ProcessItem struct {
	PID      uint32 `json:"pid"`
	Comm     string `json:"comm"`
	Class    string `json:"class"`
	Priority int    `json:"priority"`
	Reason   string `json:"reason,omitempty"`
	Fallback string `json:"fallback,omitempty"`
	// Level is applied; Planned is what the policy allows; Limit says why
	// Level is weaker.
	Level   sched.Level `json:"level"`
	Planned sched.Level `json:"planned"`
	Limit   string      `json:"limit,omitempty"`
	// State is running, suspended or gated.
	State string `json:"state"`
	// Unmanaged is set for a process at the observe level; UnmanagedReason
	// says why it is not enforced.
	Unmanaged       bool   `json:"unmanaged"`
	UnmanagedReason string `json:"unmanaged_reason,omitempty"`
	GPUs            []int  `json:"gpus"`
	LatencyCritical bool   `json:"latency_critical"`
	Launches        uint64 `json:"launches"`
	// LaunchRate is launches per second between the two latest snapshots
	// (0 for a process seen in one only).
	LaunchRate float64            `json:"launch_rate"`
	Requests   uint64             `json:"requests"`
	P50Seconds float64            `json:"p50_seconds"`
	P99Seconds float64            `json:"p99_seconds"`
	Attainment *float64           `json:"slo_attainment"` // null without requests in the SLO window
	Latency    engine.LatencyView `json:"latency"`
}

// ClassItem is one class as /classes shows it.
type ClassItem struct {
	engine.ClassView
	Attainment *float64       `json:"slo_attainment"`
	States     map[string]int `json:"states"`
}

// GPUItem is one GPU as /gpus shows it: the node's description and the
// engine's view.
type GPUItem struct {
	NodeGPU
	Processes int      `json:"processes"`
	Active    []uint32 `json:"active"`
	Held      []uint32 `json:"held"`
}

// rates keeps the two latest distinct snapshots, for launch rates.
type rates struct {
	src SnapshotSource
	mu  sync.Mutex
	cur *engine.Snapshot
	// prev is the snapshot before cur; prevBy indexes its processes.
	prev   *engine.Snapshot
	prevBy map[uint32]*engine.ProcessView
}

func newRates(src SnapshotSource) *rates { return &rates{src: src} }

// latest takes the source's snapshot, moving the one before to prev.
func (r *rates) latest() (cur, prev *engine.Snapshot, prevBy map[uint32]*engine.ProcessView) {
	s := r.src.Snapshot()
	r.mu.Lock()
	defer r.mu.Unlock()
	if s != r.cur {
		if r.cur != nil && s.Time > r.cur.Time {
			r.prev, r.prevBy = r.cur, nil
		}
		r.cur = s
	}
	if r.prev != nil && r.prevBy == nil {
		r.prevBy = make(map[uint32]*engine.ProcessView, len(r.prev.Processes))
		for i := range r.prev.Processes {
			p := &r.prev.Processes[i]
			r.prevBy[p.PID] = p
		}
	}
	return r.cur, r.prev, r.prevBy
}

// view is one snapshot with everything the handlers derive from it.
type view struct {
	snap   *engine.Snapshot
	prev   *engine.Snapshot
	prevBy map[uint32]*engine.ProcessView
}

func (s *Server) view() view {
	cur, prev, by := s.rates.latest()
	return view{snap: cur, prev: prev, prevBy: by}
}

func (v view) process(p *engine.ProcessView) ProcessItem {
	it := ProcessItem{PID: p.PID, Comm: p.Comm, Class: p.Class, Priority: p.Priority, Reason: p.Reason, Fallback: p.Fallback,
		Level: p.Level, Planned: p.Planned, Limit: p.Limit, State: p.State.String(), GPUs: p.GPUs,
		LatencyCritical: p.LatencyCritical, Launches: p.Launches, Requests: p.Latency.Requests,
		P50Seconds: p.Latency.P50.Seconds(), P99Seconds: p.Latency.P99.Seconds(),
		Attainment: attainment(p.Latency), Latency: p.Latency}
	if it.GPUs == nil {
		it.GPUs = []int{}
	}
	if p.Level == sched.LevelObserve {
		it.Unmanaged = true
		switch {
		case p.Planned != sched.LevelObserve && p.Limit != "":
			it.UnmanagedReason = p.Limit
		case p.Planned != sched.LevelObserve:
			it.UnmanagedReason = "no enforcement is possible on this process yet"
		default:
			it.UnmanagedReason = "policy plans class " + p.Class + " at the observe level"
		}
	}
	if old, ok := v.prevBy[p.PID]; ok && old.FirstSeen == p.FirstSeen && v.snap.Time > v.prev.Time && p.Launches >= old.Launches {
		it.LaunchRate = float64(p.Launches-old.Launches) / (float64(v.snap.Time-v.prev.Time) / 1e9)
	}
	return it
}

func (v view) processes(class, state string) []ProcessItem {
	out := make([]ProcessItem, 0, len(v.snap.Processes))
	for i := range v.snap.Processes {
		p := &v.snap.Processes[i]
		if class != "" && p.Class != class || state != "" && p.State.String() != state {
			continue
		}
		out = append(out, v.process(p))
	}
	return out
}

func (v view) counts() Counts {
	c := Counts{Processes: len(v.snap.Processes), States: map[string]int{}, Levels: map[string]int{}, Classes: map[string]map[string]int{}}
	for i := range v.snap.Processes {
		p := &v.snap.Processes[i]
		st := p.State.String()
		c.States[st]++
		c.Levels[p.Level.String()]++
		if p.Level == sched.LevelObserve {
			c.Unmanaged++
		}
		m := c.Classes[p.Class]
		if m == nil {
			m = map[string]int{}
			c.Classes[p.Class] = m
		}
		m[st]++
	}
	return c
}

func (s *Server) status(v view) StatusView {
	st := v.snap.Stats
	out := StatusView{Node: s.opts.Node, Version: s.opts.Version, StartedAt: s.started,
		UptimeSeconds: time.Since(s.started).Seconds(), Ready: s.ready.Load(), EngineTime: v.snap.Time,
		Engine: StatsView{Events: st.Events, Processes: st.Processes, Classifications: st.Classifications,
			ClassifyErrors: st.ClassifyErrors, Requests: st.Requests, Suspends: st.Suspends, Resumes: st.Resumes,
			Gates: st.Gates, Ungates: st.Ungates, Timeslices: st.Timeslices, Interleaves: st.Interleaves,
			EnforceErrors: st.EnforceErrors, VictimCalls: st.VictimCalls, VictimErrors: st.VictimErrors,
			Escalations: st.Escalations, Relaxes: st.Relaxes, HarvestsSkipped: st.HarvestsSkipped, Arms: st.Arms},
		Counts: v.counts(), DecisionsTotal: v.snap.DecisionsTotal, PreemptionsTotal: v.snap.PreemptionsTotal}
	// The GPUs as /gpus lists them: NVML's, and those only the trace
	// shows (a node without NVML), by index.
	out.Node.GPUs = []NodeGPU{}
	for _, g := range s.gpus(v) {
		out.Node.GPUs = append(out.Node.GPUs, g.NodeGPU)
	}
	slices.SortFunc(out.Node.GPUs, func(a, b NodeGPU) int { return cmp.Compare(a.Index, b.Index) })
	if out.Node.Levels == nil {
		out.Node.Levels = []LevelSupport{}
	}
	if s.opts.Policy != nil {
		ps := s.opts.Policy.Status()
		out.Policy = &ps
	}
	return out
}

func (v view) classes() []ClassItem {
	states := v.counts().Classes
	out := make([]ClassItem, 0, len(v.snap.Classes))
	for _, c := range v.snap.Classes {
		st := states[c.Name]
		if st == nil {
			st = map[string]int{}
		}
		out = append(out, ClassItem{ClassView: c, Attainment: attainment(c.Latency), States: st})
	}
	return out
}

func (s *Server) gpus(v view) []GPUItem {
	out := []GPUItem{}
	seen := map[int]bool{}
	for _, g := range v.snap.GPUs {
		ng, _ := s.opts.Node.gpu(g.Index)
		ng.Index = g.Index
		out = append(out, GPUItem{NodeGPU: ng, Processes: g.Processes, Active: g.Active, Held: g.Held})
		seen[g.Index] = true
	}
	for _, g := range s.opts.Node.GPUs {
		if !seen[g.Index] {
			out = append(out, GPUItem{NodeGPU: g, Active: []uint32{}, Held: []uint32{}})
		}
	}
	return out
}

// attainment is a latency view's SLO attainment, nil where it has none.
func attainment(l engine.LatencyView) *float64 {
	if !l.HasSLO || l.Attainment < 0 {
		return nil
	}
	a := l.Attainment
	return &a
}
