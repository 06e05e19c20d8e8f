package gpuvalidate

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Workload is what a workload program said about its run. The stub
// driver's infer and train and the validation's CUDA and PyTorch programs
// print the same lines, so one parser reads both:
//
//	infer: 50 requests in 0.52 s: p50 1012 us, p99 1050 us, max 1061 us
//	train: 200 launches in 1.00 s: 199.8 launches/s
//	calls: launches=200 copies=100 syncs>=50
//	window 1764000000000000000 1764000015000000000
//	progress 1764000000123000000 42
//
// The first two sum up a latency-critical and a best-effort run (a
// training loop may count steps instead of launches: "train: 40 steps in
// 1.00 s: 40.0 steps/s"); the third says which driver calls the program
// made, for a capture to be checked against. A latency-critical run may
// print the wall-clock window it measured (Unix nanoseconds), and a
// best-effort run its progress (Unix nanoseconds, units done so far), so
// that the best-effort rate can be taken over exactly the latency-critical
// run's window (see RateIn).
type Workload struct {
	// Requests and the latency percentiles in µs, where Latency is set.
	Latency          bool
	Requests         int
	Seconds          float64
	P50, P99, MaxLat float64
	// Launches (or steps, as Unit says) and their rate, where Throughput
	// is set.
	Throughput bool
	Launches   int
	Rate       float64
	Unit       string
	// Window is the wall-clock span a latency-critical run measured, in
	// Unix nanoseconds; zero where it printed none.
	Window [2]int64
	// Progress is a best-effort run's count of units done over time.
	Progress []Progress
	// Calls are the program's own counts of its driver calls.
	Calls []Expectation
	// Other holds every other line, in order.
	Other []string
}

// Progress is one progress line of a best-effort run: Done units
// (launches or steps) completed at Unix nanosecond T.
type Progress struct {
	T    int64
	Done int
}

// RateIn returns the units per second w completed between the Unix
// nanoseconds start and end, interpolating linearly between its progress
// lines; false where its progress does not cover the span.
func (w Workload) RateIn(start, end int64) (float64, bool) {
	if end <= start || len(w.Progress) < 2 {
		return 0, false
	}
	first, last := w.Progress[0], w.Progress[len(w.Progress)-1]
	if start < first.T || end > last.T {
		return 0, false
	}
	at := func(t int64) float64 {
		for i := 1; i < len(w.Progress); i++ {
			a, b := w.Progress[i-1], w.Progress[i]
			if t <= b.T {
				if b.T == a.T {
					return float64(b.Done)
				}
				return float64(a.Done) + float64(b.Done-a.Done)*float64(t-a.T)/float64(b.T-a.T)
			}
		}
		return float64(last.Done)
	}
	return (at(end) - at(start)) / (float64(end-start) / 1e9), true
}

// Expectation is a count of driver calls a capture must show: exactly N,
// or at least N where AtLeast (a runtime that may make calls of its own).
type Expectation struct {
	Name    string
	N       int
	AtLeast bool
}

// String returns e as written: "launches=200" or "syncs>=50".
func (e Expectation) String() string {
	if e.AtLeast {
		return fmt.Sprintf("%s>=%d", e.Name, e.N)
	}
	return fmt.Sprintf("%s=%d", e.Name, e.N)
}

var (
	inferLine    = regexp.MustCompile(`^(\w+): (\d+) requests in ([\d.]+) s(?:: p50 ([\d.]+) us, p99 ([\d.]+) us, max ([\d.]+) us)?`)
	trainLine    = regexp.MustCompile(`^(\w+): (\d+) (launches|steps) in ([\d.]+) s: ([\d.]+) (?:launches|steps)/s`)
	windowLine   = regexp.MustCompile(`^window (\d+) (\d+)$`)
	progressLine = regexp.MustCompile(`^progress (\d+) (\d+)$`)
	callWord     = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)(>=|=)(\d+)$`)
)

// ParseWorkload reads a workload's output (its stdout and stderr
// together). A summary line that does not parse is kept in Other.
func ParseWorkload(r io.Reader) (Workload, error) {
	var w Workload
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if m := inferLine.FindStringSubmatch(line); m != nil {
			w.Latency = true
			w.Requests, _ = strconv.Atoi(m[2])
			w.Seconds, _ = strconv.ParseFloat(m[3], 64)
			if m[4] != "" {
				w.P50, _ = strconv.ParseFloat(m[4], 64)
				w.P99, _ = strconv.ParseFloat(m[5], 64)
				w.MaxLat, _ = strconv.ParseFloat(m[6], 64)
			}
			continue
		}
		if m := trainLine.FindStringSubmatch(line); m != nil {
			w.Throughput = true
			w.Launches, _ = strconv.Atoi(m[2])
			w.Unit = m[3]
			w.Seconds, _ = strconv.ParseFloat(m[4], 64)
			w.Rate, _ = strconv.ParseFloat(m[5], 64)
			continue
		}
		if m := windowLine.FindStringSubmatch(line); m != nil {
			w.Window[0], _ = strconv.ParseInt(m[1], 10, 64)
			w.Window[1], _ = strconv.ParseInt(m[2], 10, 64)
			continue
		}
		if m := progressLine.FindStringSubmatch(line); m != nil {
			var p Progress
			p.T, _ = strconv.ParseInt(m[1], 10, 64)
			p.Done, _ = strconv.Atoi(m[2])
			if n := len(w.Progress); n > 0 && (p.T < w.Progress[n-1].T || p.Done < w.Progress[n-1].Done) {
				return w, fmt.Errorf("workload output: progress line %q goes backwards", line)
			}
			w.Progress = append(w.Progress, p)
			continue
		}
		if rest, ok := strings.CutPrefix(line, "calls:"); ok {
			calls, err := ParseExpectations(rest)
			if err != nil {
				return w, err
			}
			w.Calls = append(w.Calls, calls...)
			continue
		}
		w.Other = append(w.Other, line)
	}
	if err := sc.Err(); err != nil {
		return w, fmt.Errorf("read workload output: %w", err)
	}
	return w, nil
}

// ParseExpectations reads space-separated counts: "launches=200
// syncs>=50".
func ParseExpectations(s string) ([]Expectation, error) {
	var out []Expectation
	for _, f := range strings.Fields(s) {
		m := callWord.FindStringSubmatch(f)
		if m == nil {
			return nil, fmt.Errorf("calls: %q: want NAME=COUNT or NAME>=COUNT", f)
		}
		n, err := strconv.Atoi(m[3])
		if err != nil {
			return nil, fmt.Errorf("calls: %q: %w", f, err)
		}
		out = append(out, Expectation{Name: m[1], N: n, AtLeast: m[2] == ">="})
	}
	return out, nil
}

// WriteProbeCost records the cost of the probes per launch from the same
// back-to-back launch loop run without and with a trace attached.
func WriteProbeCost(w *Writer, unprobed, probed Workload) {
	if !unprobed.Throughput || !probed.Throughput || unprobed.Rate <= 0 || probed.Rate <= 0 {
		w.Check("probe_cost", Fail, "the launch loop printed no rate (without probes: %q, with: %q)",
			strings.Join(unprobed.Other, " / "), strings.Join(probed.Other, " / "))
		return
	}
	bare, traced := 1e9/unprobed.Rate, 1e9/probed.Rate
	w.Result("launch_ns.unprobed", bare, "ns")
	w.Result("launch_ns.probed", traced, "ns")
	w.Result("probe_cost_ns", traced-bare, "ns")
	w.Check("probe_cost", Info, "%d launches back to back: %.0f ns each without probes, %.0f ns traced (%+.0f ns, %+.0f%%)",
		probed.Launches, bare, traced, traced-bare, 100*(traced-bare)/bare)
}
