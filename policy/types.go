package policy

import (
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/policy/schema"
)

// Input is what data.arbiter.classify sees: one CUDA process and its node.
// Its JSON form is schema/input.json. input.ReadProcess builds the
// process from /proc.
type Input struct {
	Process input.Process `json:"process"`
	Node    Node          `json:"node"`
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
//
// Decisions of one policy share what they point to (SLO, Quota, Observe)
// when their values are equal: treat a Decision as read-only.
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
// reflection would cost more than the policy evaluation itself. Keys are
// built once; each object is allocated at its final size.

// keyTerms holds the input's object keys as terms, built once: read-only.
var keyTerms = func() map[string]*ast.Term {
	m := map[string]*ast.Term{}
	for _, k := range []string{"apiVersion", "node", "process", "state", "hostname", "time", "gpus",
		"index", "uuid", "name", "memory_bytes", "numa_node", "nvlink_peers", "pid", "ppid", "comm",
		"exe", "cmdline", "uid", "user", "cgroup", "pod", "env", "path", "slice", "unit",
		"container_id", "runtime", "pod_uid", "qos", "namespace", "labels", "processes", "requests",
		"slo", "demands", "class", "priority", "mode", "suspended", "gpu_share", "gpu", "age_us",
		"attainment", "target", "latency_ms", "gpus_needed", "nvlink"} {
		m[k] = ast.StringTerm(k)
	}
	return m
}()

var apiVersionTerm = ast.StringTerm(schema.APIVersion)

func item(k string, v *ast.Term) [2]*ast.Term { return [2]*ast.Term{keyTerms[k], v} }

func str(k, v string) [2]*ast.Term {
	if v == "" {
		return item(k, ast.InternedTerm(""))
	}
	return item(k, ast.StringTerm(v))
}

func num(k string, v int) [2]*ast.Term { return item(k, ast.InternedTerm(v)) }

func float(k string, v float64) [2]*ast.Term {
	if v == float64(int(v)) && v < 1<<30 && v > -(1<<30) {
		return item(k, ast.InternedTerm(int(v)))
	}
	return item(k, ast.FloatNumberTerm(v))
}

func val(k string, v ast.Value) [2]*ast.Term { return item(k, ast.NewTerm(v)) }

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
	items := make([][2]*ast.Term, 0, len(m))
	for k, v := range m {
		items = append(items, [2]*ast.Term{ast.StringTerm(k), ast.StringTerm(v)})
	}
	return ast.NewObject(items...)
}

func (g GPU) value() *ast.Term {
	items := make([][2]*ast.Term, 0, 6)
	items = append(items, num("index", g.Index), str("uuid", g.UUID), num("numa_node", g.NUMANode), val("nvlink_peers", ints(g.NVLinkPeers)))
	if g.Name != "" {
		items = append(items, str("name", g.Name))
	}
	if g.MemoryBytes > 0 {
		items = append(items, item("memory_bytes", ast.UIntNumberTerm(g.MemoryBytes)))
	}
	return ast.ObjectTerm(items...)
}

func gpusValue(gpus []GPU) ast.Value {
	ts := make([]*ast.Term, len(gpus))
	for i, g := range gpus {
		ts[i] = g.value()
	}
	return ast.NewArray(ts...)
}

func (n Node) value(gpus ast.Value) ast.Value {
	if gpus == nil {
		gpus = gpusValue(n.GPUs)
	}
	return ast.NewObject(str("hostname", n.Hostname), item("time", n.timeTerm()), val("gpus", gpus))
}

// timeTerm is the node's time as input.node.time carries it.
func (n Node) timeTerm() *ast.Term {
	t := n.Time
	if t.IsZero() {
		t = time.Unix(0, 0).UTC()
	}
	return ast.StringTerm(t.Format(time.RFC3339Nano))
}

// cgroupFields are input.process.cgroup's fields, in the input's words.
var cgroupFields = []struct {
	key string
	get func(*input.Cgroup) string
}{
	{"path", func(c *input.Cgroup) string { return c.Path }},
	{"slice", func(c *input.Cgroup) string { return c.Slice }},
	{"unit", func(c *input.Cgroup) string { return c.Unit }},
	{"container_id", func(c *input.Cgroup) string { return c.ContainerID }},
	{"runtime", func(c *input.Cgroup) string { return c.Runtime }},
	{"pod_uid", func(c *input.Cgroup) string { return c.PodUID }},
	{"qos", func(c *input.Cgroup) string { return c.QoS }},
}

func cgroupValue(c input.Cgroup) ast.Value {
	items := make([][2]*ast.Term, len(cgroupFields))
	for i, f := range cgroupFields {
		items[i] = str(f.key, f.get(&c))
	}
	return ast.NewObject(items...)
}

func processValue(p input.Process) ast.Value {
	items := make([][2]*ast.Term, 0, 11)
	items = append(items, num("pid", p.PID), num("ppid", p.PPID), str("comm", p.Comm), str("exe", p.Exe),
		val("cmdline", strs(p.Cmdline)), num("uid", p.UID), str("user", p.User),
		val("cgroup", cgroupValue(p.Cgroup)), val("env", strMap(p.Env)), val("gpus", ints(p.GPUs)))
	if p.Pod != nil {
		items = append(items, val("pod", podValue(*p.Pod)))
	}
	return ast.NewObject(items...)
}

func podValue(pod input.Pod) ast.Value {
	return ast.NewObject(str("uid", pod.UID), str("namespace", pod.Namespace), str("name", pod.Name), val("labels", strMap(pod.Labels)))
}

// value builds the whole classification input. A compiled plan reads it
// through inputSource instead, path by path.
func (in Input) value(gpus ast.Value) ast.Value {
	return ast.NewObject(item("apiVersion", apiVersionTerm), val("node", in.Node.value(gpus)), val("process", processValue(in.Process)))
}

func (s State) value(gpus ast.Value) ast.Value {
	procs := make([]*ast.Term, len(s.Processes))
	for i, p := range s.Processes {
		procs[i] = ast.ObjectTerm(num("pid", p.PID), str("comm", p.Comm), str("class", p.Class),
			num("priority", p.Priority), str("mode", string(p.Mode)), val("gpus", ints(p.GPUs)),
			item("suspended", ast.InternedTerm(p.Suspended)), float("gpu_share", p.GPUShare))
	}
	reqs := make([]*ast.Term, len(s.Requests))
	for i, r := range s.Requests {
		reqs[i] = ast.ObjectTerm(num("pid", r.PID), str("class", r.Class), num("gpu", r.GPU), num("age_us", int(r.AgeUS)))
	}
	slo := make([][2]*ast.Term, 0, len(s.SLO))
	for class, st := range s.SLO {
		slo = append(slo, [2]*ast.Term{ast.StringTerm(class), ast.ObjectTerm(float("attainment", st.Attainment),
			float("target", st.Target), float("latency_ms", st.LatencyMS), num("requests", st.Requests))})
	}
	dem := make([]*ast.Term, len(s.Demands))
	for i, d := range s.Demands {
		dem[i] = ast.ObjectTerm(num("pid", d.PID), str("class", d.Class), num("gpus_needed", d.GPUsNeeded),
			item("nvlink", ast.InternedTerm(d.NVLink)))
	}
	state := ast.NewObject(val("processes", ast.NewArray(procs...)), val("requests", ast.NewArray(reqs...)),
		val("slo", ast.NewObject(slo...)), val("demands", ast.NewArray(dem...)))
	return ast.NewObject(item("apiVersion", apiVersionTerm), val("node", s.Node.value(gpus)), val("state", state))
}
