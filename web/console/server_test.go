package console_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
	"github.com/gpu-arbiter/arbiter/web"
	"github.com/gpu-arbiter/arbiter/web/console"
)

// The console is tested against the real API server (package web) fed by
// a real engine and real policies: only the GPU and the traced processes
// are synthetic — a workload generator emits the events the uprobes would,
// on the wall clock, and the enforcer records what it is asked to do.

// hostile is a process name a careless console would execute: the kernel
// keeps 15 bytes of it as the comm; its command line carries all of it
// and reaches the console through the policy's reason.
const hostile = `<img src=x onerror=alert(1)>`

// startPolicy classifies by name: infer is latency-critical with a tight
// SLO it sometimes misses, embed a latency-critical class of its own,
// notebook is only observed, everything else is best-effort with its
// command line as the reason.
const startPolicy = `package arbiter

import data.arbiter.lib

default_decision := lib.with_reason(lib.classes["best-effort"], "default: nothing asked for another class")

comm := input.process.comm

cmdline := concat(" ", input.process.cmdline)

classify := object.union(lib.classes["latency-critical"], {
	"reason": "serving: comm infer",
	"slo": {"latency_target_ms": 30, "percentile": 99, "window_s": 30},
}) if {
	comm == "infer"
} else := object.union(lib.classes["latency-critical"], {
	"class": "embedding",
	"priority": 800,
	"reason": "embedding service",
	"slo": {"latency_target_ms": 400, "percentile": 95, "window_s": 30},
}) if {
	comm == "embed"
} else := {
	"class": "interactive",
	"priority": 300,
	"preemption": {"mode": "observe"},
	"reason": "notebooks are only observed",
} if {
	comm == "notebook"
} else := lib.with_reason(lib.classes["best-effort"], sprintf("batch job: %s", [cmdline]))
`

// proc is one synthetic CUDA process.
type proc struct {
	pid     uint32
	comm    string
	cmdline []string
	gpus    []int
}

var procs = []proc{
	{101, "infer", []string{"/opt/serve/infer", "--model", "llama-8b"}, []int{0}},
	{102, "embed", []string{"/opt/serve/embed", "--port", "9090"}, []int{1}},
	{201, "train", []string{"python", "train.py", "--epochs", "40"}, []int{0, 1}},
	{202, "etl-batch", []string{"/usr/bin/etl-batch", "--shard", "7"}, []int{1}},
	{203, hostile[:16], []string{hostile}, []int{0}},
	{301, "notebook", []string{"jupyter-kernel"}, []int{1}},
}

// gateOnly are processes whose channel handles are unknown: the node can
// only gate them.
var gateOnly = map[uint32]string{203: "no RM client traced for pid 203: its channels cannot be controlled, the launch gate stands in"}

// liveSource is an engine.DeadlineSource on the wall clock: events are
// pushed by the workload as they happen.
type liveSource struct {
	start  time.Time
	mu     sync.Mutex // orders pushes so event times never go backwards
	ch     chan trace.Event
	wake   chan struct{}
	closed chan struct{}
	once   sync.Once
	dl     atomic.Uint64
}

func newLiveSource() *liveSource {
	return &liveSource{start: time.Now(), ch: make(chan trace.Event, 4096), wake: make(chan struct{}, 1),
		closed: make(chan struct{})}
}

func (s *liveSource) Now() uint64 { return uint64(time.Since(s.start)) }

func (s *liveSource) push(ev trace.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev.Time = s.Now()
	select {
	case s.ch <- ev:
	case <-s.closed:
	}
}

func (s *liveSource) Read(ev *trace.Event) error {
	for {
		var timer <-chan time.Time
		if d := s.dl.Load(); d != 0 {
			now := s.Now()
			if d <= now {
				select {
				case *ev = <-s.ch:
					return nil
				default:
				}
				s.dl.Store(0)
				return trace.ErrDeadline
			}
			t := time.NewTimer(time.Duration(d - now))
			defer t.Stop()
			timer = t.C
		}
		select {
		case *ev = <-s.ch:
			return nil
		case <-timer:
		case <-s.wake:
			return trace.ErrDeadline
		case <-s.closed:
			return fmt.Errorf("live source: %w", trace.ErrClosed)
		}
	}
}

func (s *liveSource) SetReadDeadline(t uint64) error {
	s.dl.Store(t)
	return nil
}

// Wake makes a blocked Read return so that posted work runs.
func (s *liveSource) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *liveSource) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// recorder is the enforcer: it records every call and can only gate the
// processes in gateOnly.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) do(f string, a ...any) error {
	r.mu.Lock()
	r.calls = append(r.calls, fmt.Sprintf(f, a...))
	r.mu.Unlock()
	return nil
}
func (r *recorder) SetTimeslice(pid uint32, gpu int, us uint64) error {
	return r.do("timeslice %d gpu%d %dus", pid, gpu, us)
}
func (r *recorder) SetInterleave(pid uint32, l sched.Interleave) error {
	return r.do("interleave %d %s", pid, l)
}
func (r *recorder) Suspend(pid uint32, gpu int) error { return r.do("suspend %d gpu%d", pid, gpu) }
func (r *recorder) Resume(pid uint32, gpu int) error  { return r.do("resume %d gpu%d", pid, gpu) }
func (r *recorder) Gate(pid uint32) error             { return r.do("gate %d", pid) }
func (r *recorder) Ungate(pid uint32) error           { return r.do("ungate %d", pid) }
func (r *recorder) Strongest(pid uint32) (sched.Level, string) {
	if why, ok := gateOnly[pid]; ok {
		return sched.LevelGate, why
	}
	return sched.LevelSuspend, ""
}

func (r *recorder) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// placement puts each process on its GPUs.
type placement map[uint32][]int

func (p placement) GPUs(pid uint32) []int { return p[pid] }

// policies is the policy service: real policies (package policy) loaded
// from the files posted, kept in memory, in force through the engine's
// classifier.
type policies struct {
	mu   sync.Mutex
	cur  *policy.Policy
	hist []revision
	eng  *engine.Engine
	node policy.Node
	// readOnly is the status's read_only, as a daemon on its embedded
	// default policy or a bundle server says it.
	readOnly string
}

func (s *policies) setReadOnly(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readOnly = why
}

type revision struct {
	web.PolicyRevision
	files web.PolicyFiles
}

var _ web.PolicyService = (*policies)(nil)

func (s *policies) load(ctx context.Context, files web.PolicyFiles) (*policy.Policy, error) {
	fsys := fstest.MapFS{}
	for name, b := range files {
		fsys[name] = &fstest.MapFile{Data: b}
	}
	src, err := policy.ReadFS(fsys, ".", nil)
	if err != nil {
		return nil, err
	}
	return policy.New(ctx, src, nil)
}

func (s *policies) current() *policy.Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// classify is the engine's classifier: the policy in force over what the
// "node" knows of the process.
func (s *policies) classify(pol *policy.Policy, pid uint32, comm string) (sched.Plan, string, error) {
	in := input.Process{PID: int(pid), Comm: comm}
	for _, p := range procs {
		if p.pid == pid {
			in.Cmdline, in.GPUs = p.cmdline, p.gpus
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := pol.Classify(ctx, policy.Input{Process: in, Node: s.node})
	plan := d.Compile()
	if err != nil {
		plan.Fallback = true
	}
	return plan, d.Reason, err
}

func (s *policies) Classify(p engine.ProcessInfo) (sched.Plan, string, error) {
	return s.classify(s.current(), p.Key.PID, p.Comm)
}

func (s *policies) Status() web.PolicyStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := web.PolicyStatus{Revision: s.cur.Revision(), Files: s.cur.Source().Files(), Reloads: len(s.hist), ReadOnly: s.readOnly}
	if n := len(s.hist); n > 0 {
		st.LoadedAt = s.hist[n-1].AppliedAt
	}
	return st
}

func (s *policies) Validate(ctx context.Context, files web.PolicyFiles) ([]policy.Diagnostic, error) {
	_, err := s.load(ctx, files)
	return policy.Diagnostics(err), nil
}

func (s *policies) DryRun(ctx context.Context, files web.PolicyFiles) ([]web.ClassChange, error) {
	pol, err := s.load(ctx, files)
	if err != nil {
		return nil, err
	}
	var out []web.ClassChange
	for _, p := range s.eng.Snapshot().Processes {
		plan, reason, cerr := s.classify(pol, p.PID, p.Comm)
		c := web.ClassChange{PID: p.PID, Comm: p.Comm, FromClass: p.Class, ToClass: plan.Class, FromLevel: p.Planned, ToLevel: plan.Level, Reason: reason}
		if cerr != nil {
			c.Fallback = cerr.Error()
		}
		c.Changed = c.FromClass != c.ToClass || c.FromLevel != c.ToLevel
		out = append(out, c)
	}
	return out, nil
}

func (s *policies) Apply(ctx context.Context, files web.PolicyFiles) (string, error) {
	return s.apply(ctx, files, "api")
}

func (s *policies) apply(ctx context.Context, files web.PolicyFiles, origin string) (string, error) {
	pol, err := s.load(ctx, files)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.cur = pol
	s.hist = append(s.hist, revision{web.PolicyRevision{Revision: pol.Revision(), AppliedAt: time.Now(), Files: slices.Sorted(maps.Keys(files)), Origin: origin}, files})
	s.mu.Unlock()
	if s.eng != nil {
		s.eng.Post(func(e *engine.Engine) { e.Reclassify(nil, "policy "+pol.Revision()+" applied") })
	}
	return pol.Revision(), nil
}

func (s *policies) History() []web.PolicyRevision {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []web.PolicyRevision
	for i := len(s.hist) - 1; i >= 0; i-- {
		r := s.hist[i].PolicyRevision
		r.Current = i == len(s.hist)-1
		out = append(out, r)
	}
	return out
}

func (s *policies) Rollback(ctx context.Context, rev string) (string, error) {
	s.mu.Lock()
	i := slices.IndexFunc(s.hist, func(r revision) bool { return r.Revision == rev })
	var files web.PolicyFiles
	if i >= 0 {
		files = s.hist[i].files
	}
	s.mu.Unlock()
	if files == nil {
		return "", fmt.Errorf("%w: %q", web.ErrUnknownRevision, rev)
	}
	return s.apply(ctx, files, "rollback")
}

// node is a running console back end: engine, workload, API and console.
type node struct {
	URL   string
	Token string
	eng   *engine.Engine
	enf   *recorder
	pol   *policies
	srv   *web.Server
	hs    *http.Server
	stop  context.CancelFunc
	done  chan struct{}
	once  sync.Once
}

// startNode starts the engine on the live source, the workload, and the
// API with the console mounted at "/" on a loopback port.
func startNode(t *testing.T) *node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{enf: &recorder{}, stop: cancel, done: make(chan struct{})}
	n.pol = &policies{node: policy.Node{Hostname: "gpu-node-07", Time: time.Now(), GPUs: []policy.GPU{{Index: 0, UUID: "GPU-0"}, {Index: 1, UUID: "GPU-1"}}}}
	if _, err := n.pol.apply(ctx, web.PolicyFiles{"policy.rego": []byte(startPolicy)}, "startup"); err != nil {
		t.Fatalf("start policy: %v", err)
	}
	src := newLiveSource()
	place := placement{}
	for _, p := range procs {
		place[p.pid] = p.gpus
	}
	eng, err := engine.New(src, n.enf, &engine.Options{Classifier: n.pol, Placement: place, IdleGap: 2 * time.Millisecond,
		ControlInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n.eng, n.pol.eng = eng, eng
	go func() {
		defer close(n.done)
		if err := eng.Run(ctx); err != nil {
			t.Errorf("engine: %v", err)
		}
	}()
	go workload(ctx, src)

	tokenFile := filepath.Join(t.TempDir(), "api-token")
	n.srv, err = web.New(web.Options{Snapshots: eng, Policy: n.pol, TokenFile: tokenFile, Version: "test",
		Node: web.Node{Hostname: "gpu-node-07", DriverVersion: "570.86.15", GPUs: []web.NodeGPU{
			{Index: 0, UUID: "GPU-0", Name: "NVIDIA H100 80GB HBM3"}, {Index: 1, UUID: "GPU-1", Name: "NVIDIA H100 80GB HBM3"}}},
		Limits: web.Limits{SnapshotInterval: 250 * time.Millisecond, MutationsPerSecond: 100, MutationBurst: 100}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	n.Token = strings.TrimSpace(string(tok))
	n.srv.SetReady(true)
	mux := http.NewServeMux()
	mux.Handle("/api/", n.srv.Handler())
	mux.Handle("/", console.Handler())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.URL = "http://" + l.Addr().String()
	n.hs = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := n.hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	}()
	t.Cleanup(n.Close)
	return n
}

// StopServing stops the API and the console (the engine runs on): the
// browser loses its stream.
func (n *node) StopServing() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.srv.Shutdown(ctx)
	_ = n.hs.Close()
}

// Close stops everything; the engine releases every process it held.
func (n *node) Close() {
	n.once.Do(func() {
		n.StopServing()
		n.stop()
		<-n.done
	})
}

// workload emits what the probes would see of the processes: requests of
// the latency-critical ones (some slower than their SLO), and the steady
// launches of the others.
func workload(ctx context.Context, src *liveSource) {
	for _, p := range procs {
		ev := trace.Event{Kind: trace.KindExec, PID: p.pid, TID: p.pid}
		copy(ev.Proc.Comm[:], p.comm)
		src.push(ev)
	}
	var wg sync.WaitGroup
	request := func(pid uint32, every time.Duration, busy func(*rand.Rand) time.Duration) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(uint64(pid), 7))
		for ctx.Err() == nil {
			src.push(trace.Event{Kind: trace.KindLaunch, PID: pid, TID: pid})
			sleep(ctx, busy(rng))
			ev := trace.Event{Kind: trace.KindSync, PID: pid, TID: pid}
			ev.Sync.Duration = 1000
			src.push(ev)
			sleep(ctx, every)
		}
	}
	launches := func(pid uint32, every time.Duration) {
		defer wg.Done()
		for ctx.Err() == nil {
			src.push(trace.Event{Kind: trace.KindLaunch, PID: pid, TID: pid})
			sleep(ctx, every)
		}
	}
	wg.Add(6)
	go request(101, 60*time.Millisecond, func(r *rand.Rand) time.Duration {
		if r.IntN(20) == 0 {
			return 45 * time.Millisecond // a slow one: over the 30 ms target
		}
		return time.Duration(5+r.IntN(18)) * time.Millisecond
	})
	go request(102, 700*time.Millisecond, func(r *rand.Rand) time.Duration {
		return time.Duration(150+r.IntN(200)) * time.Millisecond
	})
	go launches(201, 3*time.Millisecond)
	go launches(202, 8*time.Millisecond)
	go launches(203, 5*time.Millisecond)
	go launches(301, 20*time.Millisecond)
	wg.Wait()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
