package gpuvalidate

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Trace is what `arbiter trace --format json` showed of one workload:
// its events on stdout, and on stderr the libraries it attached to and
// its closing summary.
type Trace struct {
	// Libraries attached, with their probe counts.
	Libraries []Library
	// Funcs counts events per driver function; Kinds per event kind
	// (launch, copy, sync, exec, exit).
	Funcs map[string]int
	Kinds map[string]int
	// HtoD and DtoH count copies per direction.
	HtoD, DtoH int
	// SyncResults counts synchronizing calls per result name.
	SyncResults map[string]int
	// Exits are the wait statuses of the traced processes' exits.
	Exits []int
	// Summary is the closing summary, nil if none was printed.
	Summary *TraceSummary
	// Problems are stderr lines that warn or fail.
	Problems []string
}

// Library is one libcuda the trace attached to.
type Library struct {
	Path   string
	Probes int
}

// TraceSummary is the part of the trace's closing summary a capture
// check reads.
type TraceSummary struct {
	Tracer struct {
		Events      int64 `json:"events"`
		Dropped     int64 `json:"dropped"`
		Undecodable int64 `json:"undecodable"`
	} `json:"tracer"`
	Processes []struct {
		PID          int      `json:"pid"`
		Comm         string   `json:"comm"`
		Launches     int64    `json:"launches"`
		LaunchesPerS *float64 `json:"launches_per_s"`
		Requests     int64    `json:"requests"`
		SyncErrors   int64    `json:"sync_errors"`
	} `json:"processes"`
}

// traceEvent is the part of one JSON event line a capture check reads.
type traceEvent struct {
	Kind       string `json:"kind"`
	Func       string `json:"func"`
	PID        int    `json:"pid"`
	Dir        string `json:"dir"`
	ResultName string `json:"result_name"`
	Result     *int64 `json:"result"`
	ExitCode   int    `json:"exit_code"`
}

var attachedLine = regexp.MustCompile(`attached (\d+) probes? (?:to|on) (\S+)`)

// ParseTrace reads a trace's stdout (events) and stderr (log). Only events
// of pid count where pid is positive: the trace was filtered to it, and
// the filter is checked.
func ParseTrace(events, log io.Reader, pid int) (*Trace, error) {
	t := &Trace{Funcs: map[string]int{}, Kinds: map[string]int{}, SyncResults: map[string]int{}}
	sc := bufio.NewScanner(events)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var ev traceEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Problems = append(t.Problems, fmt.Sprintf("undecodable event line %q: %v", line, err))
			continue
		}
		if ev.Kind == "summary" {
			if err := t.summary(line); err != nil {
				return nil, err
			}
			continue
		}
		if pid > 0 && ev.PID != pid {
			continue
		}
		t.add(&ev)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace events: %w", err)
	}
	sc = bufio.NewScanner(log)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "{"):
			if strings.Contains(line, `"kind":"summary"`) {
				if err := t.summary(line); err != nil {
					return nil, err
				}
			}
		case attachedLine.MatchString(line):
			m := attachedLine.FindStringSubmatch(line)
			var n int
			fmt.Sscan(m[1], &n)
			t.Libraries = append(t.Libraries, Library{Path: strings.TrimRight(m[2], ",:;"), Probes: n})
		case strings.Contains(line, "warning") || strings.Contains(line, "error") || strings.HasPrefix(line, "arbiter:"):
			t.Problems = append(t.Problems, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace log: %w", err)
	}
	return t, nil
}

// add counts one event.
func (t *Trace) add(ev *traceEvent) {
	t.Kinds[ev.Kind]++
	if ev.Func != "" {
		t.Funcs[ev.Func]++
	}
	switch ev.Kind {
	case "copy":
		switch ev.Dir {
		case "htod":
			t.HtoD++
		case "dtoh":
			t.DtoH++
		}
	case "sync":
		name := ev.ResultName
		if name == "" && ev.Result != nil {
			name = fmt.Sprint(*ev.Result)
		}
		if name != "" {
			t.SyncResults[name]++
		}
	case "exit":
		t.Exits = append(t.Exits, ev.ExitCode)
	}
}

// summary decodes the closing summary line.
func (t *Trace) summary(line string) error {
	var s TraceSummary
	if err := json.Unmarshal([]byte(line), &s); err != nil {
		return fmt.Errorf("trace summary %q: %w", line, err)
	}
	t.Summary = &s
	return nil
}

// Count returns the events an expectation names: launches, copies and
// syncs count kinds, htod and dtoh copies by direction, any other name a
// driver function (cuGraphLaunch).
func (t *Trace) Count(name string) int {
	switch name {
	case "launches":
		return t.Kinds["launch"]
	case "copies":
		return t.Kinds["copy"]
	case "syncs":
		return t.Kinds["sync"]
	case "htod":
		return t.HtoD
	case "dtoh":
		return t.DtoH
	}
	return t.Funcs[name]
}

// WriteCapture records what a capture saw against what the program says
// it did. exit is the program's exit status as its parent saw it, or -1
// where unknown.
func WriteCapture(w *Writer, t *Trace, program Workload, exit int) {
	if len(t.Libraries) == 0 {
		w.Check("attached", Fail, "the trace named no library it attached to (%s)", orNone(t.Problems))
	} else {
		var libs []string
		for _, l := range t.Libraries {
			libs = append(libs, fmt.Sprintf("%d probes on %s", l.Probes, l.Path))
		}
		w.Check("attached", Pass, "%s", strings.Join(libs, "; "))
	}
	if len(program.Calls) == 0 {
		w.Check("calls", Fail, "the program printed no \"calls:\" line to check the capture against (%s)", orNone(program.Other))
	}
	for _, e := range program.Calls {
		got := t.Count(e.Name)
		w.Result(e.Name, got, "calls")
		switch {
		case got < e.N:
			w.Check(e.Name, Fail, "%d captured, the program made %s: %d missed", got, e, e.N-got)
		case got > e.N && !e.AtLeast:
			w.Check(e.Name, Pass, "%d captured, the program made %s itself; the runtime made %d more", got, e, got-e.N)
		default:
			w.Check(e.Name, Pass, "%d captured, the program made %s", got, e)
		}
	}
	funcs := slices.Sorted(maps.Keys(t.Funcs))
	var seen []string
	for _, f := range funcs {
		w.Result("calls."+f, t.Funcs[f], "calls")
		seen = append(seen, fmt.Sprintf("%s ×%d", f, t.Funcs[f]))
	}
	w.Check("functions", Info, "%s", orNone(seen))
	if len(t.SyncResults) > 0 {
		var bad []string
		for _, name := range slices.Sorted(maps.Keys(t.SyncResults)) {
			if name != "CUDA_SUCCESS" && name != "0" {
				bad = append(bad, fmt.Sprintf("%s ×%d", name, t.SyncResults[name]))
			}
		}
		if len(bad) > 0 {
			w.Check("sync_results", Fail, "synchronizing calls returned %s", strings.Join(bad, ", "))
		} else {
			w.Check("sync_results", Pass, "all %d synchronizing calls returned CUDA_SUCCESS", t.Kinds["sync"])
		}
	}
	switch s := t.Summary; {
	case s == nil:
		w.Check("tracer_loss", Fail, "the trace printed no summary (killed before it could?)")
	case s.Tracer.Dropped > 0 || s.Tracer.Undecodable > 0:
		w.Check("tracer_loss", Fail, "%d events, %d dropped, %d undecodable", s.Tracer.Events, s.Tracer.Dropped, s.Tracer.Undecodable)
	default:
		w.Check("tracer_loss", Pass, "%d events read, none dropped or undecodable", s.Tracer.Events)
	}
	traced := "its exit was not traced"
	if n := len(t.Exits); n > 0 {
		traced = "traced: " + waitStatus(t.Exits[n-1])
	}
	switch {
	case exit > 0 || exit < 0 && len(t.Exits) > 0 && t.Exits[len(t.Exits)-1] != 0:
		w.Check("exit", Fail, "the program failed, exit status %d, %s (%s)", exit, traced, orNone(program.Other))
	case exit < 0:
		w.Check("exit", Info, "the program's exit status is unknown; %s", traced)
	default:
		w.Check("exit", Pass, "the program exited with status 0; %s", traced)
	}
	if len(t.Problems) > 0 {
		w.Note("the trace said: %s", strings.Join(t.Problems, " / "))
	}
}

// waitStatus describes a wait status as the kernel reports an exit.
func waitStatus(st int) string {
	if sig := st & 0x7f; sig != 0 {
		return fmt.Sprintf("killed by signal %d", sig)
	}
	return fmt.Sprintf("exit status %d", st>>8&0xff)
}

// orNone joins s, or says there was nothing.
func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
