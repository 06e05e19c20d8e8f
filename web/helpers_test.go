package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/rego"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// liveSource is an event source on the wall clock: events pushed to it
// are stamped now and read in order; deadlines fire on time; Wake makes
// a pending Read return (an event, or trace.ErrDeadline so that the
// engine runs posted work) and Close ends it. It is the smallest live DeadlineSource.
type liveSource struct {
	start    time.Time
	mu       sync.Mutex
	pending  []trace.Event
	deadline uint64
	wake     chan struct{}
	closed   chan struct{}
	once     sync.Once
}

func newLiveSource() *liveSource {
	return &liveSource{start: time.Now(), wake: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (s *liveSource) Now() uint64 { return uint64(time.Since(s.start)) + 1 }

// push stamps evs with the current time and queues them.
func (s *liveSource) push(evs ...trace.Event) {
	s.mu.Lock()
	for _, ev := range evs {
		ev.Time = s.Now()
		s.pending = append(s.pending, ev)
	}
	s.mu.Unlock()
	s.Wake()
}

func (s *liveSource) Read(ev *trace.Event) error {
	for {
		s.mu.Lock()
		if len(s.pending) > 0 {
			*ev = s.pending[0]
			s.pending = s.pending[1:]
			s.mu.Unlock()
			return nil
		}
		dl := s.deadline
		s.mu.Unlock()
		now := s.Now()
		if dl != 0 && dl <= now {
			return trace.ErrDeadline
		}
		wait := time.Hour
		if dl != 0 {
			wait = time.Duration(dl - now)
		}
		t := time.NewTimer(wait)
		select {
		case <-s.wake:
			t.Stop()
			s.mu.Lock()
			n := len(s.pending)
			s.mu.Unlock()
			if n == 0 {
				return trace.ErrDeadline // woken for posted work: let the engine run it now
			}
			continue
		case <-t.C:
		case <-s.closed:
			t.Stop()
			return fmt.Errorf("live source: %w", trace.ErrClosed)
		}
		t.Stop()
	}
}

func (s *liveSource) SetReadDeadline(t uint64) error {
	s.mu.Lock()
	s.deadline = t
	s.mu.Unlock()
	s.Wake()
	return nil
}

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

// The plans byComm gives. The latency-critical target is far above any
// request latency the fixture makes: requests are stamped on the wall
// clock, and on a loaded machine the first one (from the launch
// startEngine pushes to the sync requests pushes) can take milliseconds.
var (
	lcPlan = sched.Plan{Class: "latency-critical", Priority: 900, Level: sched.LevelTimeslice, Timeslice: 16 * time.Millisecond,
		Interleave: sched.InterleaveHigh, PrePreemptionHint: true, LatencyCritical: true, HasSLO: true,
		LatencyTarget: 5 * time.Second, Percentile: 99, Window: time.Minute, MaxGPUShare: 1}
	bePlan = sched.Plan{Class: "best-effort", Priority: 100, Level: sched.LevelSuspend, Timeslice: 200 * time.Microsecond,
		Interleave: sched.InterleaveLow, MaxGPUShare: 1}
	obsPlan = sched.Plan{Class: "observed", MaxGPUShare: 1}
)

// byComm plans "infer*" latency-critical, "watch*" observe-only and the
// rest best-effort.
var byComm = engine.ClassifierFunc(func(p engine.ProcessInfo) (sched.Plan, string, error) {
	switch {
	case len(p.Comm) >= 5 && p.Comm[:5] == "infer":
		return lcPlan, "comm infer", nil
	case len(p.Comm) >= 5 && p.Comm[:5] == "watch":
		return obsPlan, "comm watch", nil
	}
	return bePlan, "default", nil
})

// placement spreads processes over two GPUs.
type placement struct{}

func (placement) GPUs(pid uint32) []int { return []int{int(pid % 2)} }

// enforcerLog is an enforcer that records nothing and always succeeds:
// the engine's own logic decides every state, as on a node whose driver
// accepts every control.
type enforcerLog struct{}

func (enforcerLog) SetTimeslice(uint32, int, uint64) error       { return nil }
func (enforcerLog) SetInterleave(uint32, sched.Interleave) error { return nil }
func (enforcerLog) Suspend(uint32, int) error                    { return nil }
func (enforcerLog) Resume(uint32, int) error                     { return nil }
func (enforcerLog) Gate(uint32) error                            { return nil }
func (enforcerLog) Ungate(uint32) error                          { return nil }

// liveEngine is a real engine running on a liveSource.
type liveEngine struct {
	*engine.Engine
	src  *liveSource
	done chan error
}

func execEv(pid uint32, comm string) trace.Event {
	ev := trace.Event{Kind: trace.KindExec, PID: pid, TID: pid}
	copy(ev.Proc.Comm[:], comm)
	return ev
}

// startEngine runs a real engine with n processes: one in ten
// latency-critical ("infer"), one in twenty observe-only ("watch"), the
// rest best-effort; the LC ones have each served a few requests.
func startEngine(t testing.TB, n int) *liveEngine {
	t.Helper()
	src := newLiveSource()
	e, err := engine.New(src, enforcerLog{}, &engine.Options{Classifier: byComm, Placement: placement{},
		ControlInterval: 20 * time.Millisecond, IdleGap: 0})
	if err != nil {
		t.Fatal(err)
	}
	le := &liveEngine{Engine: e, src: src, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { le.done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-le.done; err != nil {
			t.Errorf("engine: %v", err)
		}
	})
	var evs []trace.Event
	for i := range n {
		pid := uint32(1000 + i)
		comm := "train"
		switch {
		case i%10 == 0:
			comm = "infer"
		case i%20 == 5:
			comm = "watch"
		}
		evs = append(evs, execEv(pid, comm), trace.Event{Kind: trace.KindLaunch, PID: pid, TID: pid})
	}
	src.push(evs...)
	le.requests(n, 3)
	le.waitFor(t, func(s *engine.Snapshot) bool { return len(s.Processes) == n })
	return le
}

// requests makes every LC process among the first n serve k requests.
func (le *liveEngine) requests(n, k int) {
	for range k {
		var evs []trace.Event
		for i := 0; i < n; i += 10 {
			pid := uint32(1000 + i)
			sync := trace.Event{Kind: trace.KindSync, PID: pid, TID: pid}
			sync.Sync.Duration = uint64(500 * time.Microsecond)
			evs = append(evs, trace.Event{Kind: trace.KindLaunch, PID: pid, TID: pid}, sync)
		}
		le.src.push(evs...)
	}
}

// waitFor waits until the published snapshot satisfies ok.
func (le *liveEngine) waitFor(t testing.TB, ok func(*engine.Snapshot) bool) *engine.Snapshot {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := le.Snapshot()
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine snapshot never got there: %d processes, %d requests", len(s.Processes), s.Stats.Requests)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dirPolicy is a PolicyService over a real policy directory and a real
// policy.Watcher: what the daemon's own implementation does, in the
// smallest form. Apply validates (load, check, Rego tests), writes each
// file atomically, removes files no longer wanted, and reloads through
// the watcher, which checks and tests again before swapping.
type dirPolicy struct {
	dir   string
	w     *policy.Watcher
	snaps SnapshotSource
	mu    sync.Mutex
	hist  []PolicyRevision
	saved map[string]PolicyFiles
	diags []policy.Diagnostic
}

func newDirPolicy(t testing.TB, snaps SnapshotSource) *dirPolicy {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "policy")
	files := readFS(t, rego.Default())
	if err := writePolicy(dir, files); err != nil {
		t.Fatal(err)
	}
	w, err := policy.Watch(t.Context(), dir, &policy.WatchOptions{Debounce: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	d := &dirPolicy{dir: dir, w: w, snaps: snaps, saved: map[string]PolicyFiles{}}
	d.record(w.Policy().Revision(), files, "startup")
	return d
}

func readFS(t testing.TB, fsys fs.FS) PolicyFiles {
	t.Helper()
	files := PolicyFiles{}
	err := fs.WalkDir(fsys, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		files[p] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func (d *dirPolicy) Status() PolicyStatus {
	st := d.w.Status()
	d.mu.Lock()
	defer d.mu.Unlock()
	var files []string
	for _, f := range d.w.Policy().Source().Files() {
		rel, _ := filepath.Rel(d.dir, f)
		files = append(files, filepath.ToSlash(rel))
	}
	return PolicyStatus{Revision: st.Revision, Files: files, LoadedAt: st.LoadedAt,
		LastError: st.LastError, LastErrorAt: st.LastErrorAt, Diagnostics: d.diags, Reloads: st.Reloads,
		Rejected: st.Rejected, Evaluator: string(st.Evaluator)}
}

// load compiles and tests files in memory.
func (d *dirPolicy) load(ctx context.Context, files PolicyFiles) (*policy.Policy, error) {
	fsys := fstest.MapFS{}
	for name, b := range files {
		fsys[name] = &fstest.MapFile{Data: b, Mode: 0o644}
	}
	src, err := policy.ReadFS(fsys, "", nil)
	if err != nil {
		return nil, err
	}
	p, err := policy.New(ctx, src, nil)
	if err != nil {
		return nil, err
	}
	rep, err := policy.Test(ctx, src, nil)
	if err != nil {
		return nil, err
	}
	var diags []policy.Diagnostic
	for _, r := range rep.Results {
		if r.Outcome == "fail" || r.Outcome == "error" {
			diags = append(diags, policy.Diagnostic{Code: policy.CodeTest, File: r.File, Row: r.Row,
				Message: fmt.Sprintf("test %s.%s: %s %s", r.Package, r.Name, r.Outcome, r.Error)})
		}
	}
	if len(diags) > 0 {
		return nil, &policy.Error{Source: "request", Diagnostics: diags}
	}
	return p, nil
}

func (d *dirPolicy) Validate(ctx context.Context, files PolicyFiles) ([]policy.Diagnostic, error) {
	if _, err := d.load(ctx, files); err != nil {
		return policy.Diagnostics(err), nil
	}
	return nil, nil
}

func (d *dirPolicy) DryRun(ctx context.Context, files PolicyFiles) ([]ClassChange, error) {
	p, err := d.load(ctx, files)
	if err != nil {
		return nil, err
	}
	var out []ClassChange
	for _, pv := range d.snaps.Snapshot().Processes {
		dec, derr := p.Classify(ctx, policy.Input{Process: input.Process{PID: int(pv.PID), Comm: pv.Comm}})
		plan := dec.Compile()
		ch := ClassChange{PID: pv.PID, Comm: pv.Comm, FromClass: pv.Class, ToClass: plan.Class, FromLevel: pv.Planned,
			ToLevel: plan.Level, Reason: dec.Reason}
		if derr != nil {
			ch.Fallback = derr.Error()
		}
		ch.Changed = ch.FromClass != ch.ToClass || ch.FromLevel != ch.ToLevel
		out = append(out, ch)
	}
	return out, nil
}

func (d *dirPolicy) Apply(ctx context.Context, files PolicyFiles) (string, error) {
	return d.apply(ctx, files, "api")
}

func (d *dirPolicy) apply(ctx context.Context, files PolicyFiles, origin string) (string, error) {
	if _, err := d.load(ctx, files); err != nil {
		d.mu.Lock()
		d.diags = policy.Diagnostics(err)
		d.mu.Unlock()
		return "", err
	}
	if err := writePolicy(d.dir, files); err != nil {
		return "", fmt.Errorf("write policy into %s: %w", d.dir, err)
	}
	if err := d.w.Reload(ctx); err != nil {
		return "", err
	}
	rev := d.w.Policy().Revision()
	d.mu.Lock()
	d.diags = nil
	d.mu.Unlock()
	d.record(rev, files, origin)
	return rev, nil
}

func (d *dirPolicy) record(rev string, files PolicyFiles, origin string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for i := range d.hist {
		d.hist[i].Current = false
	}
	d.hist = slices.Insert(d.hist, 0, PolicyRevision{Revision: rev, AppliedAt: time.Now(), Files: names, Origin: origin, Current: true})
	d.saved[rev] = files
}

// Sources reads the directory's files back.
func (d *dirPolicy) Sources() (PolicyFiles, error) {
	files := PolicyFiles{}
	err := fs.WalkDir(os.DirFS(d.dir), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		files[p], err = os.ReadFile(filepath.Join(d.dir, p))
		return err
	})
	return files, err
}

func (d *dirPolicy) History() []PolicyRevision {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.hist)
}

func (d *dirPolicy) Rollback(ctx context.Context, rev string) (string, error) {
	d.mu.Lock()
	files, ok := d.saved[rev]
	d.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("revision %q: %w", rev, ErrUnknownRevision)
	}
	return d.apply(ctx, files, "rollback")
}

// writePolicy writes files into dir, each through a temporary file and a
// rename, and removes policy files not among them.
func writePolicy(dir string, files PolicyFiles) error {
	if err := files.Check(); err != nil {
		return err
	}
	for name, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		tmp := filepath.Join(filepath.Dir(p), ".tmp-"+filepath.Base(p))
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	}
	return filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if _, keep := files[filepath.ToSlash(rel)]; !keep && checkPolicyPath(filepath.ToSlash(rel)) == nil {
			return os.Remove(p)
		}
		return nil
	})
}

// fixture is a server over a real engine and a real policy directory.
type fixture struct {
	s     *Server
	eng   *liveEngine
	pol   *dirPolicy
	token string
}

func newFixture(t testing.TB, n int, lim Limits) *fixture {
	t.Helper()
	eng := startEngine(t, n)
	pol := newDirPolicy(t, eng)
	tokPath := filepath.Join(t.TempDir(), "state", "api.token")
	s, err := New(Options{Snapshots: eng, Policy: pol, TokenFile: tokPath, Version: "test", Logger: zerolog.Nop(), Limits: lim,
		Node: Node{Hostname: "node1", DriverVersion: "580.95.05", GPUs: []NodeGPU{
			{Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA H100", MemoryBytes: 80 << 30},
			{Index: 1, UUID: "GPU-bbbb", Name: "NVIDIA H100", MemoryBytes: 80 << 30}},
			Levels: []LevelSupport{{Level: sched.LevelSuspend, Supported: false, Reason: "no GPU"}}},
		Capture: func() CaptureStats {
			return CaptureStats{Events: 10, Dropped: 1, DecodeErrors: 2, GateStops: 3, GateStopFailures: 5, GateArmedCloses: 4}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	tok, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{s: s, eng: eng, pol: pol, token: string(bytes.TrimSpace(tok))}
}

// do sends a request to the handler and returns the response.
func (f *fixture) do(method, path string, body any, hdr ...string) *httptest.ResponseRecorder {
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = bytes.NewBufferString(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		panic("body type")
	}
	req := httptest.NewRequest(method, path, r)
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	w := httptest.NewRecorder()
	f.s.Handler().ServeHTTP(w, req)
	return w
}

type engineSnapshot = engine.Snapshot

func itoa(v uint64) string { return fmt.Sprint(v) }

func launchEv(pid uint32) trace.Event { return trace.Event{Kind: trace.KindLaunch, PID: pid, TID: pid} }

func proc(s *engine.Snapshot, pid uint32) engine.ProcessView {
	for _, p := range s.Processes {
		if p.PID == pid {
			return p
		}
	}
	return engine.ProcessView{}
}

func clone(f PolicyFiles) PolicyFiles {
	out := PolicyFiles{}
	for k, v := range f {
		out[k] = slices.Clone(v)
	}
	return out
}

// policyBody is a PolicyRequest for files.
func policyBody(t testing.TB, files PolicyFiles) []byte {
	t.Helper()
	req := PolicyRequest{Files: map[string]string{}}
	for k, v := range files {
		req.Files[k] = string(v)
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
