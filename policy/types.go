package policy

import (
	"sort"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Input is what data.arbiter.classify sees: one CUDA process and its node.
// Its JSON form is schema/input.json.
type Input struct {
	Process Process `json:"process"`
	Node    Node    `json:"node"`
}

// Process describes one CUDA process. [ProcessFromProc] fills it from /proc;
// Pod namespace, name and labels come from the caller (see [ProcOptions]).
type Process struct {
	PID     int               `json:"pid"`
	PPID    int               `json:"ppid,omitempty"`
	Comm    string            `json:"comm"`
	Exe     string            `json:"exe,omitempty"`
	Cmdline []string          `json:"cmdline,omitempty"`
	UID     int               `json:"uid"`
	User    string            `json:"user,omitempty"`
	Cgroup  Cgroup            `json:"cgroup"`
	Pod     *Pod              `json:"pod,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	GPUs    []int             `json:"gpus,omitempty"`
}

// Cgroup is what a process's cgroup path says about where it runs.
type Cgroup struct {
	Path        string `json:"path,omitempty"`
	Slice       string `json:"slice,omitempty"`
	Unit        string `json:"unit,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	Runtime     string `json:"runtime,omitempty"`
	PodUID      string `json:"pod_uid,omitempty"`
	QoS         string `json:"qos,omitempty"`
}

// Pod is the Kubernetes pod a process runs in. UID comes from the cgroup
// path; the rest only when the caller resolved the UID.
type Pod struct {
	UID       string            `json:"uid"`
	Namespace string            `json:"namespace,omitempty"`
	Name      string            `json:"name,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// Node describes the machine. Time is the only clock a policy sees, so
// policies stay deterministic and testable.
type Node struct {
	Hostname string    `json:"hostname"`
	Time     time.Time `json:"time"`
	GPUs     []GPU     `json:"gpus"`
}

// GPU is one device of the node and its topology.
type GPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	NUMANode    int    `json:"numa_node"`
	NVLinkPeers []int  `json:"nvlink_peers,omitempty"`
}

// State is what data.arbiter.victims sees at control-loop rate.
type State struct {
	Node      Node                `json:"-"`
	Processes []ProcessState      `json:"processes"`
	Requests  []Request           `json:"requests,omitempty"`
	SLO       map[string]SLOState `json:"slo,omitempty"`
	Demands   []Demand            `json:"demands,omitempty"`
}

// ProcessState is one managed process as the engine sees it now.
type ProcessState struct {
	PID       int     `json:"pid"`
	Comm      string  `json:"comm,omitempty"`
	Class     string  `json:"class"`
	Priority  int     `json:"priority,omitempty"`
	Mode      Mode    `json:"mode,omitempty"`
	GPUs      []int   `json:"gpus,omitempty"`
	Suspended bool    `json:"suspended,omitempty"`
	GPUShare  float64 `json:"gpu_share,omitempty"`
}

// Request is a latency-critical request in flight on one GPU.
type Request struct {
	PID   int    `json:"pid"`
	Class string `json:"class,omitempty"`
	GPU   int    `json:"gpu"`
	AgeUS int64  `json:"age_us,omitempty"`
}

// SLOState is one class's SLO attainment over its window.
type SLOState struct {
	Attainment float64 `json:"attainment"`
	Target     float64 `json:"target"`
	LatencyMS  float64 `json:"latency_ms,omitempty"`
	Requests   int     `json:"requests,omitempty"`
}

// Demand is a latency-critical job waiting for GPUs, for topology-aware
// victim selection.
type Demand struct {
	PID        int    `json:"pid"`
	Class      string `json:"class,omitempty"`
	GPUsNeeded int    `json:"gpus_needed"`
	NVLink     bool   `json:"nvlink,omitempty"`
}

// Mode is a preemption mode, weakest to strongest: observe, timeslice,
// suspend; gate where channel control is unavailable.
type Mode string

// Preemption modes.
const (
	ModeObserve   Mode = "observe"
	ModeTimeslice Mode = "timeslice"
	ModeSuspend   Mode = "suspend"
	ModeGate      Mode = "gate"
)

// Decision is a validated classification decision (schema/decision.json).
type Decision struct {
	Class      string     `json:"class"`
	Priority   int        `json:"priority,omitempty"`
	SLO        *SLO       `json:"slo,omitempty"`
	Preemption Preemption `json:"preemption"`
	Quota      *Quota     `json:"quota,omitempty"`
	Observe    []string   `json:"observe,omitempty"`
	Reason     string     `json:"reason,omitempty"`
}

// SLO is a latency objective: Percentile percent of requests within
// LatencyTargetMS over a sliding window of WindowS seconds.
type SLO struct {
	LatencyTargetMS float64 `json:"latency_target_ms"`
	Percentile      float64 `json:"percentile"`
	WindowS         float64 `json:"window_s"`
}

// Preemption says how a process yields the GPU.
type Preemption struct {
	Mode              Mode   `json:"mode"`
	TimesliceUS       int    `json:"timeslice_us,omitempty"`
	Interleave        string `json:"interleave,omitempty"`
	PrePreemptionHint bool   `json:"pre_preemption_hint,omitempty"`
}

// Quota caps a process's share of GPU time (0..1).
type Quota struct {
	MaxGPUShare float64 `json:"max_gpu_share"`
}

// VictimDecision is a validated control-loop decision (schema/victims.json).
type VictimDecision struct {
	Suspend  []Suspension `json:"suspend,omitempty"`
	Throttle []Throttle   `json:"throttle,omitempty"`
}

// Suspension asks to suspend a process, on the given GPUs or all of its own.
type Suspension struct {
	PID    int    `json:"pid"`
	GPUs   []int  `json:"gpus,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Throttle caps a process's GPU-time share until the next decision.
type Throttle struct {
	PID         int     `json:"pid"`
	MaxGPUShare float64 `json:"max_gpu_share"`
	Reason      string  `json:"reason,omitempty"`
}

// The input is built straight into OPA's AST: going through JSON or
// reflection would cost more than the policy evaluation itself.

type obj struct{ o ast.Object }

func newObj() obj { return obj{ast.NewObject()} }

func (b obj) str(k, v string) obj {
	b.o.Insert(ast.InternedTerm(k), ast.StringTerm(v))
	return b
}

func (b obj) strIf(k, v string) obj {
	if v != "" {
		b.str(k, v)
	}
	return b
}

func (b obj) num(k string, v int) obj {
	b.o.Insert(ast.InternedTerm(k), ast.InternedTerm(v))
	return b
}

func (b obj) float(k string, v float64) obj {
	b.o.Insert(ast.InternedTerm(k), ast.FloatNumberTerm(v))
	return b
}

func (b obj) val(k string, v ast.Value) obj {
	b.o.Insert(ast.InternedTerm(k), ast.NewTerm(v))
	return b
}

func ints(xs []int) ast.Value {
	ts := make([]*ast.Term, len(xs))
	for i, x := range xs {
		ts[i] = ast.InternedTerm(x)
	}
	return ast.NewArray(ts...)
}

func strs(xs []string) ast.Value {
	ts := make([]*ast.Term, len(xs))
	for i, x := range xs {
		ts[i] = ast.StringTerm(x)
	}
	return ast.NewArray(ts...)
}

func strMap(m map[string]string) ast.Value {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	o := ast.NewObject()
	for _, k := range keys {
		o.Insert(ast.StringTerm(k), ast.StringTerm(m[k]))
	}
	return o
}

func (n Node) value() ast.Value {
	gpus := make([]*ast.Term, len(n.GPUs))
	for i, g := range n.GPUs {
		o := newObj().num("index", g.Index).str("uuid", g.UUID).strIf("name", g.Name).
			num("numa_node", g.NUMANode).val("nvlink_peers", ints(g.NVLinkPeers))
		if g.MemoryBytes > 0 {
			o.o.Insert(ast.InternedTerm("memory_bytes"), ast.UIntNumberTerm(g.MemoryBytes))
		}
		gpus[i] = ast.NewTerm(o.o)
	}
	t := n.Time
	if t.IsZero() {
		t = time.Unix(0, 0).UTC()
	}
	return newObj().str("hostname", n.Hostname).str("time", t.Format(time.RFC3339Nano)).
		val("gpus", ast.NewArray(gpus...)).o
}

func (c Cgroup) value() ast.Value {
	return newObj().str("path", c.Path).str("slice", c.Slice).str("unit", c.Unit).
		str("container_id", c.ContainerID).str("runtime", c.Runtime).str("pod_uid", c.PodUID).
		str("qos", c.QoS).o
}

func (p Process) value() ast.Value {
	o := newObj().num("pid", p.PID).num("ppid", p.PPID).str("comm", p.Comm).str("exe", p.Exe).
		val("cmdline", strs(p.Cmdline)).num("uid", p.UID).str("user", p.User).
		val("cgroup", p.Cgroup.value()).val("env", strMap(p.Env)).val("gpus", ints(p.GPUs))
	if p.Pod != nil {
		o.val("pod", newObj().str("uid", p.Pod.UID).str("namespace", p.Pod.Namespace).
			str("name", p.Pod.Name).val("labels", strMap(p.Pod.Labels)).o)
	}
	return o.o
}

func (in Input) value() ast.Value {
	return newObj().str("apiVersion", APIVersion).val("node", in.Node.value()).
		val("process", in.Process.value()).o
}

func (s State) value() ast.Value {
	procs := make([]*ast.Term, len(s.Processes))
	for i, p := range s.Processes {
		o := newObj().num("pid", p.PID).str("comm", p.Comm).str("class", p.Class).
			num("priority", p.Priority).str("mode", string(p.Mode)).val("gpus", ints(p.GPUs)).
			val("suspended", ast.Boolean(p.Suspended)).float("gpu_share", p.GPUShare)
		procs[i] = ast.NewTerm(o.o)
	}
	reqs := make([]*ast.Term, len(s.Requests))
	for i, r := range s.Requests {
		reqs[i] = ast.NewTerm(newObj().num("pid", r.PID).str("class", r.Class).num("gpu", r.GPU).
			num("age_us", int(r.AgeUS)).o)
	}
	slo := ast.NewObject()
	for class, st := range s.SLO {
		slo.Insert(ast.StringTerm(class), ast.NewTerm(newObj().float("attainment", st.Attainment).
			float("target", st.Target).float("latency_ms", st.LatencyMS).num("requests", st.Requests).o))
	}
	dem := make([]*ast.Term, len(s.Demands))
	for i, d := range s.Demands {
		dem[i] = ast.NewTerm(newObj().num("pid", d.PID).str("class", d.Class).
			num("gpus_needed", d.GPUsNeeded).val("nvlink", ast.Boolean(d.NVLink)).o)
	}
	state := newObj().val("processes", ast.NewArray(procs...)).val("requests", ast.NewArray(reqs...)).
		val("slo", slo).val("demands", ast.NewArray(dem...))
	return newObj().str("apiVersion", APIVersion).val("node", s.Node.value()).val("state", state.o).o
}
