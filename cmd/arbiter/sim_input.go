package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/sim/workload"
)

// errTraceGiven is loadSpec's answer to a trace recorded by `arbiter trace
// --record` given instead of a spec: spec replays every process of it,
// for the user to save and set each process's class. sim prints spec on
// stdout, so that it can be redirected into a file, and the error on
// stderr.
type errTraceGiven struct {
	path, spec string
	// noSpec: the spec was not written (JSON was asked for stdout).
	noSpec bool
}

func (e *errTraceGiven) Error() string {
	if e.noSpec {
		return fmt.Sprintf("%s is a trace recorded by arbiter trace --record, not a workload spec; "+
			"without --format json, sim writes a spec that replays it to stdout (arbiter sim --workload %s > %s.yaml)",
			e.path, e.path, strings.TrimSuffix(e.path, filepath.Ext(e.path)))
	}
	return fmt.Sprintf("%s is a trace recorded by arbiter trace --record, not a workload spec; "+
		"a spec that replays it is on stdout: save it beside the trace (arbiter sim --workload %s > %s.yaml), "+
		"set each process's class to lc or be, give LC processes an SLO, then run arbiter sim --workload on it",
		e.path, e.path, strings.TrimSuffix(e.path, filepath.Ext(e.path)))
}

// loadSpec loads a workload spec, or fails with *errTraceGiven given a
// trace.
func loadSpec(path string) (*workload.File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read workload: %w", err)
	}
	defer fh.Close()
	head := make([]byte, 8)
	n, _ := io.ReadFull(fh, head)
	if !workload.IsTrace(head[:n]) {
		return workload.Load(path)
	}
	if _, err := fh.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	procs, err := workload.TraceProcesses(fh)
	if err != nil {
		return nil, fmt.Errorf("%s is a trace recorded by arbiter trace --record, and it cannot be read: %w", path, err)
	}
	return nil, &errTraceGiven{path: path, spec: replaySpec(path, procs)}
}

// yamlString writes s as a YAML scalar: as it is where it is a plain
// name, else quoted (a file name may hold ": ", '#' or anything else).
func yamlString(s string) string {
	if validName(s) {
		return s
	}
	return strconv.Quote(s)
}

// replaySpec writes a spec that replays every process of a trace.
func replaySpec(path string, procs []workload.TraceProcess) string {
	var b bytes.Buffer
	base := filepath.Base(path)
	fmt.Fprintf(&b, "name: %s\ngpus: 1\n", yamlString(workload.NameFrom(path)))
	if span := traceSpan(procs); span > 0 {
		// Without it the replay runs for the default minute, mostly idle.
		fmt.Fprintf(&b, "duration: %v   # the trace's calls span %v\n", span.Round(time.Millisecond)+time.Millisecond, span)
	}
	fmt.Fprintf(&b, "replay:\n  - file: %s\n    # An LC process: class: lc, an slo (e.g. slo: {target: 5ms}), and request_end: sync\n"+
		"    # where each of its requests ends with a synchronization (docs/simulator.md, \"Requests\").\n    processes:\n", yamlString(base))
	if len(procs) == 0 {
		b.WriteString("      [] # the trace holds no driver calls\n")
	}
	for i, p := range procs {
		name := fmt.Sprintf("proc%d", p.PID)
		sel := fmt.Sprintf("pid: %d", p.PID)
		if p.Comm != "" && validName(p.Comm) {
			name, sel = p.Comm, "comm: "+p.Comm
		}
		if p.Comm != "" && countComm(procs, p.Comm) > 1 {
			name, sel = fmt.Sprintf("%s-%d", name, i), fmt.Sprintf("pid: %d", p.PID)
		}
		fmt.Fprintf(&b, "      - {%s, name: %s, class: be, gpu: 0}   # %d driver calls\n", sel, name, p.Calls)
	}
	return b.String()
}

// traceSpan is the time from the first call of the trace's processes to
// the last.
func traceSpan(procs []workload.TraceProcess) time.Duration {
	if len(procs) == 0 {
		return 0
	}
	first, last := procs[0].First, procs[0].Last
	for _, p := range procs {
		first, last = min(first, p.First), max(last, p.Last)
	}
	return time.Duration(last - first)
}

func countComm(procs []workload.TraceProcess, comm string) int {
	n := 0
	for _, p := range procs {
		if p.Comm == comm {
			n++
		}
	}
	return n
}

// validName reports whether a process name can serve as a workload name.
func validName(s string) bool {
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || (i > 0 && strings.ContainsRune("._-", r))
		if !ok {
			return false
		}
	}
	return s != ""
}
