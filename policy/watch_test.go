package policy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const goodPolicy = header + `classify := {"class": "latency-critical"} if input.process.comm == "vllm"
`

const goodTest = `package arbiter_test

import data.arbiter

test_vllm if arbiter.classify.class == "latency-critical" with input.process.comm as "vllm"
`

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replace writes a file the way editors do: a temp file renamed over it.
func replace(t *testing.T, path, body string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestWatcherReload(t *testing.T) {
	dir := writeDir(t, map[string]string{"p.rego": goodPolicy, "p_test.rego": goodTest})
	var mu sync.Mutex
	var reloads []error
	onReload := func(_ *Policy, err error) {
		mu.Lock()
		reloads = append(reloads, err)
		mu.Unlock()
	}
	w, err := Watch(context.Background(), dir, &WatchOptions{Debounce: 20 * time.Millisecond, OnReload: onReload})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	first := w.Status()
	if first.Revision == "" || first.LastError != "" || w.Policy().Revision() != first.Revision || first.Evaluator != EvaluatorPlan || first.EvaluatorNote != "" {
		t.Fatalf("initial status %+v", first)
	}
	classOf := func(comm string) string {
		d, _ := w.Policy().Classify(context.Background(), testInput(1, comm))
		return d.Class
	}

	// 1. A valid change is swapped in.
	replace(t, filepath.Join(dir, "p.rego"), goodPolicy+`classify := {"class": "batch"} if input.process.comm == "train"`+"\n")
	waitFor(t, "valid policy swapped", func() bool { return w.Status().Reloads == 1 })
	if classOf("train") != "batch" || classOf("vllm") != "latency-critical" || w.Status().LastError != "" {
		t.Fatalf("after valid change: %q %q %+v", classOf("train"), classOf("vllm"), w.Status())
	}
	good := w.Status().Revision

	// 2. A broken policy is kept out, and the error is exposed.
	replace(t, filepath.Join(dir, "p.rego"), header+"classify := {\n")
	waitFor(t, "invalid policy rejected", func() bool { return w.Status().Rejected == 1 })
	st := w.Status()
	if st.Revision != good || !strings.Contains(st.LastError, "p.rego:6: rego_parse_error") || st.LastErrorRevision == "" || st.LastErrorAt.IsZero() {
		t.Fatalf("after invalid change: %+v", st)
	}
	if classOf("train") != "batch" {
		t.Fatal("last good policy not kept")
	}

	// 3. A policy that compiles but fails its own tests is kept out too.
	replace(t, filepath.Join(dir, "p.rego"), header+`classify := {"class": "best-effort"}`+"\n")
	waitFor(t, "failing-test policy rejected", func() bool { return w.Status().Rejected == 2 })
	st = w.Status()
	if st.Revision != good || !strings.Contains(st.LastError, "p_test.rego:5: arbiter_test_failure: test arbiter_test.test_vllm: fail") {
		t.Fatalf("after failing test: %+v", st)
	}

	// 4. Fixing it clears the error.
	replace(t, filepath.Join(dir, "p.rego"), goodPolicy)
	waitFor(t, "fixed policy swapped", func() bool { return w.Status().Reloads == 2 })
	if st := w.Status(); st.LastError != "" || st.Rejected != 2 {
		t.Fatalf("after fix: %+v", st)
	}
	waitFor(t, "four OnReload calls", func() bool { mu.Lock(); defer mu.Unlock(); return len(reloads) == 4 })
	mu.Lock()
	defer mu.Unlock()
	if len(reloads) != 4 || reloads[0] != nil || reloads[1] == nil || reloads[2] == nil || reloads[3] != nil {
		t.Fatalf("OnReload calls: %v", reloads)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestWatcherConfigMapSwap(t *testing.T) {
	// A ConfigMap volume: files are symlinks into ..data, which is itself a
	// symlink swapped atomically to a new timestamped directory.
	dir := t.TempDir()
	mk := func(name, body string) {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "p.rego"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("..2026_01_01", goodPolicy)
	if err := os.Symlink("..2026_01_01", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/p.rego", filepath.Join(dir, "p.rego")); err != nil {
		t.Fatal(err)
	}
	w, err := Watch(context.Background(), dir, &WatchOptions{Debounce: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mk("..2026_01_02", goodPolicy+`classify := {"class": "batch"} if input.process.comm == "train"`+"\n")
	if err := os.Symlink("..2026_01_02", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ConfigMap update swapped", func() bool { return w.Status().Reloads == 1 })
	if d, _ := w.Policy().Classify(context.Background(), testInput(1, "train")); d.Class != "batch" {
		t.Fatalf("class %q", d.Class)
	}
}

func TestWatchRejectsBadStart(t *testing.T) {
	dir := writeDir(t, map[string]string{"p.rego": header + "classify := {\n"})
	if _, err := Watch(context.Background(), dir, nil); err == nil {
		t.Fatal("Watch accepted a broken policy")
	}
}

func TestWatcherDebounces(t *testing.T) {
	dir := writeDir(t, map[string]string{"p.rego": goodPolicy})
	// The debounce outlasts any stall of a loaded machine between two
	// writes of the burst.
	w, err := Watch(context.Background(), dir, &WatchOptions{Debounce: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A burst of writes, as a checkout or a ConfigMap sync makes: one reload.
	for i := range 5 {
		body := fmt.Sprintf("package arbiter.extra%d\n\nx := %d\n", i, i)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("extra%d.rego", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "reload after the burst", func() bool { return w.Status().Reloads >= 1 })
	time.Sleep(500 * time.Millisecond)
	if st := w.Status(); st.Reloads != 1 || st.Rejected != 0 {
		t.Fatalf("status %+v, want exactly one reload", st)
	}
	if got := len(w.Policy().Source().Modules); got < 6 {
		t.Fatalf("%d modules", got)
	}
	// Touching a file without changing it reloads nothing.
	now := time.Now()
	os.Chtimes(filepath.Join(dir, "p.rego"), now, now)
	if err := w.Reload(context.Background()); err != nil || w.Status().Reloads != 1 {
		t.Fatalf("unchanged content reloaded: %v %+v", err, w.Status())
	}
}

func TestClassifyConcurrently(t *testing.T) {
	p, err := LoadFS(context.Background(), defaultPolicyFS(), "default", nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				in := benchInput()
				in.Node.GPUs = in.Node.GPUs[:1+(g+i)%8] // the GPU cache changes under the readers
				d, err := p.Classify(context.Background(), in)
				if err != nil || d.Class != "latency-critical" || d.SLO.LatencyTargetMS != 50 {
					t.Errorf("%+v %v", d, err)
					return
				}
				v, err := p.Victims(context.Background(), State{Node: in.Node, Processes: []ProcessState{{PID: 1, Class: "best-effort", Mode: ModeSuspend, GPUs: []int{0}}}, Requests: []Request{{PID: 2, GPU: 0}}})
				if err != nil || len(v.Suspend) != 1 {
					t.Errorf("%+v %v", v, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestWatcherBundle(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.tar.gz")
	files := map[string]string{"/.manifest": `{"revision": "r1"}`, "/p.rego": goodPolicy}
	writeBundle(t, path, files)
	w, err := Watch(context.Background(), path, &WatchOptions{Debounce: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	files["/.manifest"] = `{"revision": "r2"}`
	writeBundle(t, path+".tmp", files)
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bundle r2 swapped", func() bool { return w.Status().Revision == "r2" })
	files["/p.rego"] = header + "classify := {\n"
	writeBundle(t, path+".tmp", files)
	os.Rename(path+".tmp", path)
	waitFor(t, "broken bundle rejected", func() bool { return w.Status().Rejected == 1 })
	if st := w.Status(); st.Revision != "r2" || !strings.Contains(st.LastError, "rego_parse_error") {
		t.Fatalf("%+v", st)
	}
}

// TestWatcherBrokenChangeUndone: a broken file removed again leaves the
// directory holding the policy in force: the rejection it caused is over,
// and the status says so without another content change.
func TestWatcherBrokenChangeUndone(t *testing.T) {
	dir := writeDir(t, map[string]string{"p.rego": goodPolicy, "p_test.rego": goodTest})
	w, err := Watch(context.Background(), dir, &WatchOptions{Debounce: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	good := w.Status().Revision
	broken := filepath.Join(dir, "q.rego")
	replace(t, broken, header+"classify := {\n")
	waitFor(t, "the broken file rejected", func() bool { return w.Status().Rejected == 1 })
	if err := os.Remove(broken); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(context.Background()); err != nil {
		t.Fatalf("reload after the broken file went: %v", err)
	}
	if st := w.Status(); st.Revision != good || st.LastError != "" || !st.LastErrorAt.IsZero() || st.LastErrorRevision != "" || st.Rejected != 1 {
		t.Fatalf("after the broken file went: %+v", st)
	}
}
