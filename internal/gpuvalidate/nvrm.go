package gpuvalidate

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// NVRMReport is the Markdown report of nvrm's hardware procedure
// (TestGPUValidate, nvrm/gpu_validate_test.go), split into its parts. The
// parser reads it by headings and table columns and keeps what it does not
// know, so that the procedure can grow without breaking it.
type NVRMReport struct {
	// Header is the text before the first heading (driver, victim).
	Header string
	// Parts are the report's "###" parts in order.
	Parts []ReportPart
	// Outcome is the go test verdict, "PASS", "FAIL" or "SKIP", where the
	// report came with the test's log; Errors its error lines.
	Outcome string
	Errors  []string
}

// ReportPart is one "###" part: its title, its tables and other lines.
type ReportPart struct {
	Title  string
	Tables []Table
	Lines  []string
}

// Table is a Markdown table; each row holds one cell per column.
type Table struct {
	Columns []string
	Rows    [][]string
}

// Column returns row's cell in the named column, or "".
func (t *Table) Column(row []string, name string) string {
	for i, c := range t.Columns {
		if strings.EqualFold(c, name) && i < len(row) {
			return row[i]
		}
	}
	return ""
}

// Part returns the first part whose title starts with prefix, or nil.
func (r *NVRMReport) Part(prefix string) *ReportPart {
	for i := range r.Parts {
		if strings.HasPrefix(r.Parts[i].Title, prefix) {
			return &r.Parts[i]
		}
	}
	return nil
}

// ParseNVRMReport reads the procedure's report: a Markdown file, or the
// log of `nvrm.test -test.v`, where the test logs the report indented
// under its file:line prefix, and where the verdict comes from.
func ParseNVRMReport(r io.Reader) (*NVRMReport, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read nvrm report: %w", err)
	}
	text := string(b)
	rep := &NVRMReport{}
	if strings.Contains(text, "=== RUN") {
		text = rep.fromTestLog(text)
	}
	var part *ReportPart
	var table *Table
	var header []string
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\r\n")
		trimmed := strings.TrimSpace(line)
		if title, ok := strings.CutPrefix(trimmed, "### "); ok {
			rep.Parts = append(rep.Parts, ReportPart{Title: strings.TrimSpace(title)})
			part, table = &rep.Parts[len(rep.Parts)-1], nil
			continue
		}
		if part == nil {
			if trimmed != "" {
				header = append(header, trimmed)
			}
			continue
		}
		if !strings.HasPrefix(trimmed, "|") {
			table = nil
			if trimmed != "" {
				part.Lines = append(part.Lines, trimmed)
			}
			continue
		}
		cells := splitRow(trimmed)
		switch {
		case table == nil:
			part.Tables = append(part.Tables, Table{Columns: cells})
			table = &part.Tables[len(part.Tables)-1]
		case isSeparator(cells):
		default:
			table.Rows = append(table.Rows, cells)
		}
	}
	rep.Header = strings.Join(header, " ")
	return rep, nil
}

// fromTestLog takes the verdict and errors from a go test log and returns
// the report the test logged, or the whole log if it logged none.
func (r *NVRMReport) fromTestLog(log string) string {
	var report []string
	in := false
	for line := range strings.Lines(log) {
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "--- PASS"):
			r.Outcome = "PASS"
		case strings.HasPrefix(line, "--- FAIL"):
			r.Outcome = "FAIL"
		case strings.HasPrefix(line, "--- SKIP"):
			r.Outcome = "SKIP"
		}
		if strings.HasPrefix(line, "    ") && !strings.HasPrefix(line, "        ") {
			// A t.Log or t.Error line: "    file.go:12: text".
			msg := strings.TrimSpace(line)
			if _, rest, ok := strings.Cut(msg, ".go:"); ok {
				if _, text, ok := strings.Cut(rest, ": "); ok {
					msg = text
				} else {
					msg = ""
				}
			}
			in = msg == ""
			if !in && !strings.Contains(msg, "=== ") {
				r.Errors = append(r.Errors, msg)
			}
			continue
		}
		if in && strings.HasPrefix(line, "        ") {
			report = append(report, line[8:])
			continue
		}
		if in && strings.TrimSpace(line) == "" {
			report = append(report, "")
			continue
		}
		in = false
	}
	if len(report) == 0 {
		return log
	}
	return strings.Join(report, "\n")
}

// splitRow splits a table row into trimmed cells.
func splitRow(line string) []string {
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	cells := strings.Split(line, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// isSeparator reports whether cells are a header separator (---).
func isSeparator(cells []string) bool {
	for _, c := range cells {
		if strings.Trim(c, "-: ") != "" {
			return false
		}
	}
	return len(cells) > 0
}

var (
	trialsLine  = regexp.MustCompile(`(\d+) of (\d+) trials completed`)
	preemptLine = regexp.MustCompile(`(?i)PREEMPT[^.\n]*timeout[^0-9\n]*([\d,]+)\s*(µs|us)`)
	reapplyLine = regexp.MustCompile(`Re-applying[^:]*: (\d+) errors`)
	verdictLine = regexp.MustCompile("verification after the trials: `([^`]*)`")
	stoppedCell = regexp.MustCompile(`^(\d+)/(\d+)$`)
)

// MaxPreemptTimeoutUs is the largest PREEMPT timeout the driver accepts.
const MaxPreemptTimeoutUs = 1_000_000

// WriteNVRM records the checks of nvrm's procedure: the allocation
// sequence it traced, each control's status, the interleave level read
// back from the registry only, PREEMPT's explicit timeout, suspend/resume
// latency per method, and the victim's work after resume.
func WriteNVRM(w *Writer, rep *NVRMReport) {
	switch rep.Outcome {
	case "PASS":
		w.Check("procedure", Pass, "nvrm's TestGPUValidate passed")
	case "FAIL":
		w.Check("procedure", Fail, "nvrm's TestGPUValidate failed: %s", orNone(rep.Errors))
	case "SKIP":
		w.Check("procedure", Fail, "nvrm's TestGPUValidate skipped: %s", orNone(rep.Errors))
	}
	if rep.Header != "" {
		w.Note("%s", rep.Header)
	}
	if len(rep.Parts) == 0 {
		w.Check("report", Fail, "the procedure wrote no report")
		return
	}
	writeAllocs(w, rep)
	writeControls(w, rep)
	writeSuspends(w, rep)
	writeAfter(w, rep)
}

// writeAllocs checks the traced allocation sequence and the registry.
func writeAllocs(w *Writer, rep *NVRMReport) {
	p := rep.Part("Allocation sequence")
	if p == nil || len(p.Tables) == 0 {
		w.Check("alloc_traced", Fail, "the report has no traced allocation sequence")
		return
	}
	t := &p.Tables[0]
	classes := map[string]int{}
	var order, engines, controls []string
	for _, row := range t.Rows {
		switch t.Column(row, "call") {
		case "rm_alloc":
			c := t.Column(row, "class")
			if classes[c] == 0 {
				order = append(order, c)
			}
			classes[c]++
			if c == "channel-group" {
				engines = append(engines, t.Column(row, "engine / value"))
			}
		case "rm_control":
			controls = append(controls, t.Column(row, "engine / value"))
		}
	}
	var seq []string
	for _, c := range order {
		seq = append(seq, fmt.Sprintf("%s ×%d", c, classes[c]))
	}
	w.Result("alloc_calls", len(t.Rows), "calls")
	w.Result("channel_groups", classes["channel-group"], "groups")
	switch {
	case classes["channel-group"] == 0:
		w.Check("alloc_traced", Fail, "%d calls traced, no channel group: %s", len(t.Rows), orNone(seq))
	default:
		w.Check("alloc_traced", Pass, "%d calls traced: %s; channel-group engines %s", len(t.Rows), strings.Join(seq, ", "), strings.Join(engines, ", "))
	}
	w.Check("process_controls", Info, "controls the process issued itself: %s", orNone(controls))
	if r := rep.Part("Registry"); r != nil {
		var groups []string
		for _, l := range r.Lines {
			if g, ok := strings.CutPrefix(l, "- channel group "); ok {
				groups = append(groups, g)
			}
		}
		w.Check("registry", Info, "%s", orNone(groups))
	}
}

// writeControls checks each control's status and the read-backs.
func writeControls(w *Writer, rep *NVRMReport) {
	p := rep.Part("Controls from another process")
	if p == nil || len(p.Tables) == 0 {
		w.Check("controls", Fail, "the report has no table of controls")
		return
	}
	t := &p.Tables[0]
	type verdict struct {
		n    int
		bad  []string
		seen []string
	}
	by := map[string]*verdict{}
	get := func(c string) *verdict {
		if by[c] == nil {
			by[c] = &verdict{}
		}
		return by[c]
	}
	firstGroup := ""
	getInterleave := false
	for _, row := range t.Rows {
		ctl, arg, res, back := t.Column(row, "control"), t.Column(row, "argument"), t.Column(row, "result"), t.Column(row, "read back")
		group, engine := t.Column(row, "group"), t.Column(row, "engine")
		if firstGroup == "" {
			firstGroup = group
		}
		if strings.Contains(ctl, "GET_INTERLEAVE") {
			getInterleave = true
		}
		v := get(ctl)
		v.n++
		switch ctl {
		case "SET_TIMESLICE":
			us, limited := timesliceArg(arg)
			if res != "NV_OK" && limited {
				v.bad = append(v.bad, fmt.Sprintf("%s %s %s: %s", group, engine, arg, res))
			}
			if group == firstGroup {
				v.seen = append(v.seen, fmt.Sprintf("%s→%s", arg, orStatus(back, res)))
				if us >= 0 {
					if n, err := strconv.ParseFloat(strings.TrimSuffix(back, " µs"), 64); err == nil && res == "NV_OK" {
						w.Result(fmt.Sprintf("timeslice_readback.%d", us), n, "us")
					}
				}
			}
		case "SET_INTERLEAVE_LEVEL":
			want := arg + " (registry)"
			if res != "NV_OK" || back != want {
				v.bad = append(v.bad, fmt.Sprintf("%s %s %s: %s, read back %q", group, engine, arg, res, back))
			} else if group == firstGroup {
				v.seen = append(v.seen, arg)
			}
		default:
			if res != "NV_OK" {
				v.bad = append(v.bad, fmt.Sprintf("%s %s: %s", group, engine, res))
			} else if group == firstGroup && back != "" {
				v.seen = append(v.seen, back)
			}
		}
	}
	check := func(name, ctl, what string) {
		v := by[ctl]
		switch {
		case v == nil:
			w.Check(name, Fail, "%s was not issued", ctl)
		case len(v.bad) > 0:
			w.Check(name, Fail, "%d of %d calls failed: %s", len(v.bad), v.n, strings.Join(v.bad, "; "))
		default:
			w.Check(name, Pass, "%d calls NV_OK; %s %s", v.n, what, strings.Join(v.seen, ", "))
		}
	}
	check("get_info", "GET_INFO", "first group:")
	check("set_timeslice", "SET_TIMESLICE", "set→GET_TIMESLICE on the first group (a limit past 1 s may be refused):")
	check("interleave", "SET_INTERLEAVE_LEVEL", "levels read back from the registry's record:")
	issued := issuedControls(rep)
	switch {
	case getInterleave || issued["GET_INTERLEAVE_LEVEL"] > 0:
		w.Check("no_get_interleave", Fail, "GET_INTERLEAVE_LEVEL was issued, which no driver exports")
	default:
		w.Check("no_get_interleave", Pass, "GET_INTERLEAVE_LEVEL never issued (the driver does not export it: NOT_SUPPORTED); the level is read back from the registry only")
	}
	for _, name := range []string{"GPFIFO_SCHEDULE", "SET_TIMESLICE", "GET_TIMESLICE", "PREEMPT", "GET_INFO", "SET_INTERLEAVE_LEVEL", "FIFO_DISABLE_CHANNELS"} {
		if n, ok := issued[name]; ok {
			w.Result("issued."+name, n, "calls")
		}
	}
	writePreempt(w, rep, issued)
}

// writePreempt checks that PREEMPT went with an explicit timeout the driver
// accepts, where the report says which.
func writePreempt(w *Writer, rep *NVRMReport, issued map[string]int) {
	timeout := -1
	for _, p := range rep.Parts {
		for _, l := range append(p.Lines, rep.Header) {
			if m := preemptLine.FindStringSubmatch(l); m != nil {
				timeout, _ = strconv.Atoi(strings.ReplaceAll(m[1], ",", ""))
			}
		}
	}
	n := issued["PREEMPT"]
	switch {
	case n == 0:
		w.Check("preempt_timeout", Fail, "PREEMPT was not issued")
	case timeout < 0:
		w.Check("preempt_timeout", Info, "PREEMPT issued %d times; this procedure does not print the timeout it sends (nvrm sends bManualTimeout=1 with its PREEMPT timeout, at most %d µs)", n, MaxPreemptTimeoutUs)
	case timeout == 0 || timeout > MaxPreemptTimeoutUs:
		w.Check("preempt_timeout", Fail, "PREEMPT issued %d times with timeout %d µs: want 1 to %d µs", n, timeout, MaxPreemptTimeoutUs)
	default:
		w.Result("preempt_timeout", timeout, "us")
		w.Check("preempt_timeout", Pass, "PREEMPT issued %d times with bManualTimeout=1, timeoutUs=%d (≤ %d)", n, timeout, MaxPreemptTimeoutUs)
	}
}

// issuedControls reads the table of controls this process issued.
func issuedControls(rep *NVRMReport) map[string]int {
	out := map[string]int{}
	p := rep.Part("Controls Arbiter issued")
	if p == nil || len(p.Tables) == 0 {
		return out
	}
	t := &p.Tables[0]
	for _, row := range t.Rows {
		n, err := strconv.Atoi(t.Column(row, "calls"))
		if err == nil {
			out[t.Column(row, "control")] += n
		}
	}
	return out
}

// writeSuspends records each suspend method's latency and the variants.
func writeSuspends(w *Writer, rep *NVRMReport) {
	var methods []string
	for _, p := range rep.Parts {
		if !strings.HasPrefix(p.Title, "Suspend") {
			continue
		}
		method := MethodSlug(p.Title)
		methods = append(methods, method)
		completed, trials := -1, -1
		var failed []string
		for _, l := range p.Lines {
			if m := trialsLine.FindStringSubmatch(l); m != nil {
				completed, _ = strconv.Atoi(m[1])
				trials, _ = strconv.Atoi(m[2])
			}
			if f, ok := strings.CutPrefix(l, "- FAILED "); ok {
				failed = append(failed, f)
			}
		}
		for _, t := range p.Tables {
			for _, row := range t.Rows {
				name := slug(t.Column(row, "measure"))
				for _, q := range []string{"p50", "p99", "max"} {
					if d, err := time.ParseDuration(t.Column(row, q)); err == nil {
						w.Result(method+"."+name+"."+q, float64(d)/float64(time.Microsecond), "us")
					}
				}
			}
		}
		w.Result(method+".trials", completed, "trials")
		switch {
		case completed < 0:
			w.Check("suspend."+method, Fail, "the report does not say how many trials completed")
		case completed < trials || len(failed) > 0:
			w.Check("suspend."+method, Fail, "%d of %d trials completed; %d failures: %s", completed, trials, len(failed), summarize(failed, 3))
		default:
			w.Check("suspend."+method, Pass, "%d of %d trials: the kernel stopped after each suspend and restarted after each resume", completed, trials)
		}
	}
	switch {
	case len(methods) == 0:
		w.Check("suspend", Fail, "the report has no suspend measurement")
	case !slices.Contains(methods, "disable-channels") || !slices.Contains(methods, "schedule"):
		w.Check("suspend_methods", Skip, "this procedure measures only %s, not both FIFO_DISABLE_CHANNELS (disable-channels) and GPFIFO_SCHEDULE{0} + PREEMPT (schedule)", strings.Join(methods, ", "))
	default:
		w.Check("suspend_methods", Pass, "both measured: %s", strings.Join(methods, ", "))
	}
	if p := rep.Part("Disable alone"); p != nil && len(p.Tables) > 0 {
		t := &p.Tables[0]
		for _, row := range t.Rows {
			name := "variant." + slug(row[0])
			stopped := ""
			if len(row) > 1 {
				stopped = row[1]
			}
			median := ""
			if len(row) > 2 {
				median = row[2]
			}
			if m := stoppedCell.FindStringSubmatch(stopped); m != nil {
				n, _ := strconv.Atoi(m[1])
				w.Result(name+".stopped", n, "trials")
			}
			w.Check(name, Info, "%s: stopped in %s trials, median %s", row[0], stopped, median)
		}
	}
}

// writeAfter checks the victim's results after all the trials.
func writeAfter(w *Writer, rep *NVRMReport) {
	p := rep.Part("After resume")
	if p == nil {
		w.Check("after_resume", Fail, "the report does not say how the victim ended")
		return
	}
	verdict, reapply := "", -1
	for _, l := range p.Lines {
		if m := verdictLine.FindStringSubmatch(l); m != nil {
			verdict = m[1]
		}
		if m := reapplyLine.FindStringSubmatch(l); m != nil {
			reapply, _ = strconv.Atoi(m[1])
		}
	}
	if strings.HasPrefix(verdict, "correct") {
		w.Check("after_resume", Pass, "the victim's own check after all trials: %s", verdict)
	} else {
		w.Check("after_resume", Fail, "the victim's own check after all trials: %q", verdict)
	}
	switch {
	case reapply == 0:
		w.Check("reapply_timeslice", Pass, "Arbiter's timeslice re-applied after the process's own without error")
	case reapply > 0:
		w.Check("reapply_timeslice", Fail, "%d errors re-applying Arbiter's timeslice after the process's own", reapply)
	}
	var later []string
	for _, t := range p.Tables {
		for _, row := range t.Rows {
			if t.Column(row, "call") == "exit" {
				continue
			}
			later = append(later, strings.TrimSpace(t.Column(row, "call")+" "+t.Column(row, "class")+" "+t.Column(row, "engine / value")))
		}
	}
	w.Check("later_calls", Info, "calls the victim made after its context was set up (does CUDA re-apply its timeslice?): %s", orNone(later))
}

// MethodSlug names a suspend method from its part's title: by the name
// the title gives it ("Suspend (schedule: GPFIFO_SCHEDULE{0} + PREEMPT)
// and resume" is "schedule"), else by the controls it names, with the
// names of `arbiter channels suspend --method`: FIFO_DISABLE_CHANNELS is
// "disable-channels", GPFIFO_SCHEDULE with PREEMPT "schedule"; else the
// title's words.
func MethodSlug(title string) string {
	inner := title
	if _, in, ok := strings.Cut(title, "("); ok {
		inner, _, _ = strings.Cut(in, ")")
	}
	if name, _, ok := strings.Cut(inner, ":"); ok && methodName.MatchString(name) {
		return name
	}
	u := strings.ToUpper(inner)
	switch {
	case strings.Contains(u, "FIFO_DISABLE") || strings.Contains(u, "DISABLE_CHANNELS"):
		return "disable-channels"
	case strings.Contains(u, "GPFIFO_SCHEDULE") && strings.Contains(u, "PREEMPT"):
		return "schedule"
	}
	return slug(inner)
}

var methodName = regexp.MustCompile(`^[a-z][a-z0-9+_-]*$`)

// slug lowercases s and joins its words with underscores.
func slug(s string) string {
	f := strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '+' && r != '-'
	})
	return strings.Join(f, "_")
}

// timesliceArg reads a SET_TIMESLICE argument: its µs (-1 for "read only")
// and whether it is within the 1 s the driver is documented to take.
func timesliceArg(arg string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimSuffix(arg, " µs"))
	if err != nil {
		return -1, true
	}
	return n, n <= 1_000_000
}

// orStatus returns back, or the status where the call failed.
func orStatus(back, status string) string {
	if status != "NV_OK" {
		return status
	}
	return back
}

// summarize joins the first n of s and says how many more there were.
func summarize(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(s[:n], "; "), len(s)-n)
}

// readLines returns r's lines, trimmed of their line ends.
func readLines(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		out = append(out, strings.TrimRight(sc.Text(), "\r"))
	}
	return out, sc.Err()
}
