package gpuvalidate

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Step is one command the channels section ran, as the script logs it:
//
//	@@ <label> <start ms> <end ms> <exit status> <command>
//	<its output, stdout and stderr, line by line>
//
// Times are wall-clock milliseconds since the epoch, the clock the victim
// reports its stalls in.
type Step struct {
	Label      string
	Start, End float64
	Exit       int
	Command    string
	Output     []string
}

// ParseSteps reads a channels section's command log.
func ParseSteps(r io.Reader) ([]Step, error) {
	lines, err := readLines(r)
	if err != nil {
		return nil, fmt.Errorf("read command log: %w", err)
	}
	var steps []Step
	for i, line := range lines {
		rest, ok := strings.CutPrefix(line, "@@ ")
		if !ok {
			if len(steps) == 0 {
				if strings.TrimSpace(line) != "" {
					return nil, fmt.Errorf("command log line %d: output before the first @@ header: %q", i+1, line)
				}
				continue
			}
			s := &steps[len(steps)-1]
			s.Output = append(s.Output, line)
			continue
		}
		f := fields(rest, 5)
		if len(f) < 4 {
			return nil, fmt.Errorf("command log line %d: want @@ <label> <start ms> <end ms> <exit> <command>: %q", i+1, line)
		}
		var s Step
		s.Label = f[0]
		s.Start, err = strconv.ParseFloat(f[1], 64)
		if err == nil {
			s.End, err = strconv.ParseFloat(f[2], 64)
		}
		if err == nil {
			s.Exit, err = strconv.Atoi(f[3])
		}
		if err != nil {
			return nil, fmt.Errorf("command log line %d: %w", i+1, err)
		}
		if len(f) == 5 {
			s.Command = f[4]
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// Victim is what the channel-control victim printed: "ready ADDR" once its
// kernel spins, "monitor on" where it watches its own kernel, "stall START
// MS" for each time the kernel made no progress for a while (START in
// wall-clock ms since the epoch), and its verdict after "stop".
type Victim struct {
	Ready    bool
	Monitor  bool
	Stalls   []Stall
	Verdict  string
	Messages []string
}

// Stall is a time the victim's kernel made no progress.
type Stall struct{ Start, Ms float64 }

// ParseVictim reads the victim's output.
func ParseVictim(r io.Reader) (Victim, error) {
	var v Victim
	lines, err := readLines(r)
	if err != nil {
		return v, fmt.Errorf("read victim output: %w", err)
	}
	for _, l := range lines {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "ready"):
			v.Ready = true
		case l == "monitor on":
			v.Monitor = true
		case strings.HasPrefix(l, "stall "):
			var s Stall
			if _, err := fmt.Sscanf(l, "stall %g %g", &s.Start, &s.Ms); err == nil {
				v.Stalls = append(v.Stalls, s)
			} else {
				v.Messages = append(v.Messages, l)
			}
		case strings.HasPrefix(l, "correct") || strings.HasPrefix(l, "wrong"):
			v.Verdict = l
		case l != "":
			v.Messages = append(v.Messages, l)
		}
	}
	return v, nil
}

// listedProcess is one process of `arbiter channels list --format json`.
type listedProcess struct {
	PID    int  `json:"pid"`
	Known  bool `json:"known"`
	Groups []struct {
		Engine      string `json:"engine"`
		Channels    int    `json:"channels"`
		Timeslice   *int64 `json:"timeslice_us"`
		Queried     *int64 `json:"queried_timeslice_us"`
		TimesliceBy string `json:"timeslice_set_by"`
		State       string `json:"state"`
		GPU         int    `json:"gpu"`
	} `json:"groups"`
}

// watchEvent is one line of `arbiter channels watch --format json`.
type watchEvent struct {
	PID       int    `json:"pid"`
	Kind      string `json:"kind"`
	ClassName string `json:"class_name"`
	Engine    string `json:"engine"`
	Control   string `json:"control"`
	Value     int64  `json:"value"`
}

var (
	suspendedIn = regexp.MustCompile(`suspended in (\S+)(?: \((.*)\))?`)
	resumedIn   = regexp.MustCompile(`resumed in (\S+)`)
	reportsUs   = regexp.MustCompile(`set to (\d+) µs, driver reports (\d+) µs`)
)

// WriteChannels records the checks of the channels section: the commands
// an operator runs, in order, on a victim whose RM allocations a pinned
// tracer saw, and where the victim watches its own kernel, whether each
// suspension stopped it.
func WriteChannels(w *Writer, steps []Step, victim Victim, pid int) {
	byLabel := func(prefix string) []Step {
		var out []Step
		for _, s := range steps {
			if s.Label == prefix || strings.HasPrefix(s.Label, prefix+".") {
				out = append(out, s)
			}
		}
		return out
	}
	if s := byLabel("watch"); len(s) > 0 {
		writeWatch(w, s[0], pid)
	}
	for i, s := range byLabel("list") {
		writeList(w, s, pid, i)
	}
	for _, s := range byLabel("timeslice") {
		var seen []string
		for _, l := range s.Output {
			if m := reportsUs.FindStringSubmatch(l); m != nil {
				seen = append(seen, fmt.Sprintf("set %s µs, driver reports %s µs", m[1], m[2]))
			}
		}
		w.Check(s.Label, exitStatus(s), "exit %d: %s", s.Exit, orNone(dedupe(seen, s.Output)))
	}
	var levels []string
	var bad []string
	for _, s := range byLabel("interleave") {
		if s.Exit != 0 {
			bad = append(bad, fmt.Sprintf("%s exit %d: %s", s.Label, s.Exit, strings.Join(s.Output, " / ")))
		} else {
			levels = append(levels, strings.TrimPrefix(s.Label, "interleave."))
		}
	}
	switch {
	case len(bad) > 0:
		w.Check("interleave", Fail, "%s", strings.Join(bad, "; "))
	case len(levels) > 0:
		w.Check("interleave", Pass, "set %s; the driver cannot read it back, \"channels list\" shows Arbiter's record", strings.Join(levels, ", "))
	}
	writeSuspendTrials(w, byLabel("suspend"), victim)
	for _, s := range byLabel("resume") {
		w.Check(s.Label, exitStatus(s), "exit %d: %s", s.Exit, orNone(s.Output))
	}
	switch {
	case victim.Verdict == "":
		w.Check("after_resume", Fail, "the victim gave no verdict (%s)", orNone(victim.Messages))
	case strings.HasPrefix(victim.Verdict, "correct"):
		w.Check("after_resume", Pass, "the victim's own check after it all: %s", victim.Verdict)
	default:
		w.Check("after_resume", Fail, "the victim's own check after it all: %s", victim.Verdict)
	}
}

// writeWatch checks that the pinned tracer saw the victim's allocations.
func writeWatch(w *Writer, s Step, pid int) {
	classes := map[string]int{}
	var order, engines, controls []string
	for _, l := range s.Output {
		if !strings.HasPrefix(strings.TrimSpace(l), "{") {
			continue
		}
		var ev watchEvent
		if json.Unmarshal([]byte(l), &ev) != nil || ev.PID != pid {
			continue
		}
		switch ev.Kind {
		case "rm_alloc":
			if classes[ev.ClassName] == 0 {
				order = append(order, ev.ClassName)
			}
			classes[ev.ClassName]++
			if ev.Engine != "" {
				engines = append(engines, ev.Engine)
			}
		case "rm_control":
			controls = append(controls, fmt.Sprintf("%s %d", ev.Control, ev.Value))
		}
	}
	var seq []string
	for _, c := range order {
		seq = append(seq, fmt.Sprintf("%s ×%d", c, classes[c]))
	}
	if classes["channel-group"] == 0 {
		w.Check("watch", Fail, "exit %d; no channel group of the victim (pid %d) traced: %s", s.Exit, pid, orNone(seq))
		return
	}
	w.Check("watch", Pass, "the victim's allocations: %s; engines %s; its own controls: %s", strings.Join(seq, ", "), strings.Join(engines, ", "), orNone(controls))
}

// writeList checks that `channels list --format json` shows the victim's
// channel groups.
func writeList(w *Writer, s Step, pid, i int) {
	name := "list"
	if i > 0 {
		name = fmt.Sprintf("list.%d", i+1)
	}
	// The output is the list, maybe after notes and warnings on stderr.
	var procs []listedProcess
	start := slices.IndexFunc(s.Output, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), "[") })
	if start < 0 {
		w.Check(name, Fail, "exit %d, printed no JSON list: %s", s.Exit, summarize(s.Output, 5))
		return
	}
	if err := json.NewDecoder(strings.NewReader(strings.Join(s.Output[start:], "\n"))).Decode(&procs); err != nil {
		w.Check(name, Fail, "exit %d, output is not a JSON list (%v): %s", s.Exit, err, summarize(s.Output, 5))
		return
	}
	var notes []string
	for _, l := range s.Output[:start] {
		if l = strings.TrimSpace(l); l != "" {
			notes = append(notes, l)
		}
	}
	if len(notes) > 0 {
		w.Note("%s said: %s", name, strings.Join(notes, " / "))
	}
	for _, p := range procs {
		if p.PID != pid {
			continue
		}
		if !p.Known || len(p.Groups) == 0 {
			w.Check(name, Fail, "pid %d listed with known=%v and %d groups", pid, p.Known, len(p.Groups))
			return
		}
		var gs []string
		for _, g := range p.Groups {
			ts := "?"
			if g.Queried != nil {
				ts = fmt.Sprintf("%d µs queried", *g.Queried)
			}
			if g.Timeslice != nil {
				ts += fmt.Sprintf(", %d µs by %s", *g.Timeslice, g.TimesliceBy)
			}
			gs = append(gs, fmt.Sprintf("%s on GPU %d (%d channels, %s, %s)", g.Engine, g.GPU, g.Channels, ts, g.State))
		}
		w.Result(name+".groups", len(p.Groups), "groups")
		w.Check(name, Pass, "%d groups: %s", len(p.Groups), strings.Join(gs, "; "))
		return
	}
	w.Check(name, Fail, "pid %d is not listed (%d processes)", pid, len(procs))
}

// writeSuspendTrials records the suspend trials per method: how long the
// commands' calls took, and whether the victim's kernel stalled.
func writeSuspendTrials(w *Writer, steps []Step, victim Victim) {
	type method struct {
		name             string
		suspend, resume  []time.Duration
		failed           []string
		how              string // the command's account of what it did
		stalled, watched int
		stallMs          []float64
	}
	var methods []*method
	find := func(name string) *method {
		for _, m := range methods {
			if m.name == name {
				return m
			}
		}
		m := &method{name: name}
		methods = append(methods, m)
		return m
	}
	for _, s := range steps {
		// suspend.<method>.<trial>
		parts := strings.Split(s.Label, ".")
		name := "default"
		if len(parts) >= 3 {
			name = strings.Join(parts[1:len(parts)-1], ".")
		}
		m := find(name)
		var sus, res time.Duration
		for _, l := range s.Output {
			if x := suspendedIn.FindStringSubmatch(l); x != nil {
				sus, _ = time.ParseDuration(x[1])
				if m.how == "" {
					m.how = x[2]
				}
			}
			if x := resumedIn.FindStringSubmatch(l); x != nil {
				res, _ = time.ParseDuration(x[1])
			}
		}
		if s.Exit != 0 || sus == 0 {
			m.failed = append(m.failed, fmt.Sprintf("%s exit %d: %s", s.Label, s.Exit, summarize(s.Output, 2)))
			continue
		}
		m.suspend = append(m.suspend, sus)
		if res > 0 {
			m.resume = append(m.resume, res)
		}
		if victim.Monitor {
			m.watched++
			if st, ok := longestStall(victim.Stalls, s.Start, s.End); ok {
				m.stalled++
				m.stallMs = append(m.stallMs, st.Ms)
			}
		}
	}
	for _, m := range methods {
		for _, d := range []struct {
			what string
			v    []time.Duration
		}{{"suspend_call", m.suspend}, {"resume_call", m.resume}} {
			if len(d.v) == 0 {
				continue
			}
			p50, p99, max := Percentiles(d.v)
			for i, x := range []time.Duration{p50, p99, max} {
				w.Result(fmt.Sprintf("%s.%s.%s", m.name, d.what, quantiles[i]), float64(x)/float64(time.Microsecond), "us")
			}
		}
		n := len(m.suspend) + len(m.failed)
		if len(m.failed) > 0 {
			w.Check("suspend."+m.name, Fail, "%d of %d trials failed: %s", len(m.failed), n, summarize(m.failed, 3))
		} else {
			p50, p99, _ := Percentiles(m.suspend)
			how := ""
			if m.how != "" {
				how = " (" + m.how + ")"
			}
			w.Check("suspend."+m.name, Pass, "%d trials of suspend --for and resume%s: suspend call p50 %v, p99 %v", n, how, p50, p99)
		}
		switch {
		case !victim.Monitor:
			w.Check("stopped."+m.name, Skip, "the victim does not watch its own kernel (the stand-in's \"kernel\" is a CPU thread nothing suspends)")
		case m.stalled < m.watched:
			w.Check("stopped."+m.name, Fail, "the kernel stalled during %d of %d suspensions", m.stalled, m.watched)
		default:
			slices.Sort(m.stallMs)
			w.Check("stopped."+m.name, Pass, "the kernel stalled during each of %d suspensions, median stall %.1f ms", m.watched, m.stallMs[len(m.stallMs)/2])
		}
	}
}

// longestStall returns the longest stall that overlaps [start, end].
func longestStall(stalls []Stall, start, end float64) (Stall, bool) {
	var best Stall
	found := false
	for _, s := range stalls {
		if s.Start <= end && s.Start+s.Ms >= start && s.Ms > best.Ms {
			best, found = s, true
		}
	}
	return best, found
}

// Percentiles returns the p50, p99 and maximum of v, as nvrm's procedure
// computes them.
func Percentiles(v []time.Duration) (p50, p99, max time.Duration) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.5), at(0.99), s[len(s)-1]
}

// exitStatus is PASS for exit 0, else FAIL.
func exitStatus(s Step) Status {
	if s.Exit == 0 {
		return Pass
	}
	return Fail
}

// dedupe returns seen, or all where seen is empty.
func dedupe(seen, all []string) []string {
	if len(seen) > 0 {
		return slices.Compact(seen)
	}
	return all
}

// quantiles name Percentiles' results in result names.
var quantiles = [...]string{"p50", "p99", "max"}

var (
	methodFlag   = regexp.MustCompile(`--method\s+\S+\s+(.*)`)
	flagDefault  = regexp.MustCompile(`\(default "([^"]*)"\)`)
	methodWord   = regexp.MustCompile(`^[a-z][a-z0-9+_-]*$`)
	quotedWord   = regexp.MustCompile(`"([a-z][a-z0-9+_-]*)"`)
	alternatives = regexp.MustCompile(`[a-z][a-z0-9+_-]*(?:\|[a-z][a-z0-9+_-]*)+`)
)

// SuspendMethods reads the suspend methods `arbiter channels suspend
// --help` offers through its --method flag, from the flag's line: "how:
// auto, schedule or disable-channels (default "auto")" offers auto,
// schedule and disable-channels. It returns nil where the command has no
// such flag.
func SuspendMethods(help string) []string {
	var out []string
	for line := range strings.Lines(help) {
		m := methodFlag.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		usage := m[1]
		def := ""
		if d := flagDefault.FindStringSubmatch(usage); d != nil {
			def = d[1]
			usage = strings.Replace(usage, d[0], "", 1)
		}
		var words []string
		if _, after, ok := cutLast(usage, ":"); ok {
			// "how: a, b or c"
			words = strings.FieldsFunc(after, func(r rune) bool { return r == ',' || r == '|' || r == ' ' || r == '\t' })
		} else {
			// "how to suspend, "a" or "b"", or "a|b|c"
			for _, q := range quotedWord.FindAllStringSubmatch(usage, -1) {
				words = append(words, q[1])
			}
			for _, a := range alternatives.FindAllString(usage, -1) {
				words = append(words, strings.Split(a, "|")...)
			}
		}
		for _, f := range words {
			f = strings.Trim(f, `"'.;()`)
			if f != "or" && f != "and" && methodWord.MatchString(f) && !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
		if def != "" && !slices.Contains(out, def) {
			out = append(out, def)
		}
	}
	return out
}
