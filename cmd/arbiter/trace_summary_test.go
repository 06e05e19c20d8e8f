package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

func TestTraceSummaryJSON(t *testing.T) {
	// replayEvents, and a trainer (pid 400) launching for 2 s: long
	// enough for a rate.
	evs := replayEvents()
	for i := uint64(0); i <= 4; i++ {
		evs = append(evs, trace.Event{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: 400, TID: 400,
			Time: 6_000_000_000 + i*500_000_000})
	}
	path := writeReplay(t, evs)
	stdout, stderr, err := runCmd(t, "trace", "--replay", path, "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(stdout, "\n"); n != 8+5 {
		t.Errorf("%d event lines, want 13", n)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 1 {
		t.Fatalf("stderr holds more than the JSON summary:\n%s", stderr)
	}
	// Decoded generically, so that the field names are what is checked.
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, stderr)
	}
	if got["kind"] != "summary" || got["idle_gap_ns"] != float64(2_000_000) || got["other_processes"] != float64(1) {
		t.Errorf("summary %v", got)
	}
	if _, ok := got["tracer"]; ok {
		t.Error("a replay has no tracer counters")
	}
	procs, _ := got["processes"].([]any)
	if len(procs) != 3 {
		t.Fatalf("processes %v, want 100, 200 and 400", procs)
	}
	infer := procs[0].(map[string]any)
	for field, want := range map[string]any{"pid": float64(100), "comm": "infer", "launches": float64(1),
		"launches_per_s": nil, "copies": float64(2), "copy_bytes": float64(1<<20 + 4096), "htod_bytes": float64(1 << 20),
		"dtoh_bytes": float64(4096), "requests": float64(2), "syncs": float64(1), "sync_time_ns": float64(960_000),
		"max_sync_ns": float64(960_000), "sync_errors": float64(0), "first_ns": float64(5_001_000_000),
		"active_ns": float64(10_000_000), "exited": true, "exit_code": float64(0)} {
		if v, ok := infer[field]; !ok || v != want {
			t.Errorf("infer %s = %v (present %v), want %v", field, v, ok, want)
		}
	}
	if rate := procs[2].(map[string]any)["launches_per_s"]; rate != float64(2.5) {
		t.Errorf("launches over 2 s: launches_per_s %v, want 2.5", rate)
	}
	if _, ok := procs[1].(map[string]any)["exit_code"]; ok {
		t.Error("exit_code of a process that did not exit")
	}
}

func TestTraceSummaryTracerCountersAndPlurals(t *testing.T) {
	var w bytes.Buffer
	s := trace.NewSummary(nil)
	s.Add(&trace.Event{Kind: trace.KindLaunch, PID: 7, Time: 1})
	stats := &uprobe.Stats{Events: 1, Drops: 2, DecodeErrors: 3}
	if err := printSummary(&w, "text", s, stats, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\n1 CUDA process (", "; 0 other processes started", "tracer: 1 event in 1.5s, 2 dropped (ring buffer full), 3 undecodable"} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, w.String())
		}
	}
	w.Reset()
	if err := printSummary(&w, "json", s, stats, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var js jsonSummary
	if err := json.Unmarshal(w.Bytes(), &js); err != nil || js.Tracer == nil ||
		*js.Tracer != (jsonTracer{Events: 1, Dropped: 2, Undecodable: 3, WallNS: int64(1500 * time.Millisecond)}) {
		t.Errorf("JSON tracer counters %+v, %v:\n%s", js.Tracer, err, w.String())
	}

	w.Reset()
	printLibraries(&w, uprobe.Stats{Libraries: []uprobe.Library{{Path: "/a", Attached: []string{"cuLaunchKernel"}},
		{Path: "/b", Attached: []string{"x", "y"}}}})
	if want := "arbiter trace: attached 1 probe to /a\narbiter trace: attached 2 probes to /b\n"; w.String() != want {
		t.Errorf("libraries:\n%s\nwant:\n%s", w.String(), want)
	}
	for n, want := range map[int]string{0: "0 events", 1: "1 event", 2: "2 events"} {
		if got := counted(n, "event", "events"); got != want {
			t.Errorf("counted(%d) = %q", n, got)
		}
	}
}

// TestLibraryWatch: a trace that starts before any libcuda is in use
// says so, and then says when the rescan attaches one, each library once,
// looking at most once a second.
func TestLibraryWatch(t *testing.T) {
	var libs []uprobe.Library
	var w bytes.Buffer
	l := newLibraryWatch(func() uprobe.Stats { return uprobe.Stats{Libraries: libs} }, &w)
	if got := w.String(); got != "arbiter trace: no libcuda found yet; rescanning every 2s (--lib PATH adds one)\n" {
		t.Fatalf("start: %q", got)
	}
	w.Reset()
	now := time.Unix(100, 0)
	libs = []uprobe.Library{{Path: "/a", Attached: []string{"cuLaunchKernel"}}}
	l.check(now)
	libs = append(libs, uprobe.Library{Path: "/b", Error: "bad ELF"})
	l.check(now.Add(500 * time.Millisecond)) // within the second: not looked at
	if got := w.String(); got != "arbiter trace: attached 1 probe to /a\n" {
		t.Fatalf("first look: %q", got)
	}
	l.check(now.Add(1100 * time.Millisecond))
	l.check(now.Add(2200 * time.Millisecond))
	if got := w.String(); got != "arbiter trace: attached 1 probe to /a\narbiter trace: /b: not attached: bad ELF\n" {
		t.Fatalf("later: %q", got)
	}
}
