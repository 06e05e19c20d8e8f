package gpuvalidate

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Status is a check's verdict or the way a section ended.
type Status string

// Verdicts of a check.
const (
	Pass Status = "PASS" // what was expected was seen
	Fail Status = "FAIL" // something else was seen
	Skip Status = "SKIP" // not checked, and the line says why
	Info Status = "INFO" // seen and recorded, nothing expected
)

// How a section ended, as the script records it.
const (
	Done    Status = "DONE"    // it ran to its end; its checks give the verdict
	Timeout Status = "TIMEOUT" // its time budget ran out
	Error   Status = "ERROR"   // it failed before its checks were complete
)

// Results is a parsed results file.
type Results struct {
	// Meta describes the machine and the run, in file order.
	Meta []Meta
	// Sections in the order they first appear.
	Sections []*Section
	// Malformed holds lines that could not be read, with their numbers,
	// so that the report shows them rather than hides them.
	Malformed []string
}

// Meta is one fact about the machine or the run.
type Meta struct{ Key, Value string }

// Section is what one section of the script recorded.
type Section struct {
	Name string
	// End is how the section ended, empty if it never said.
	End     Status
	Seconds float64
	// Why explains End where it is not Done.
	Why         string
	Runs        []string
	Checks      []Check
	Values      []Value
	Notes       []string
	Attachments []Attachment
}

// Check is one verdict and what it was drawn from.
type Check struct {
	Name   string
	Status Status
	Seen   string
}

// Value is one measurement. Text is the value as written; Num its number
// where it is one.
type Value struct {
	Name  string
	Text  string
	Num   float64
	IsNum bool
	Unit  string
}

// Attachment is a file of raw output kept with the results, relative to the
// results directory. Format is "text" (shown verbatim) or "markdown"
// (included as it is, its headings moved below the report's).
type Attachment struct {
	Format, File, Title string
}

// MetaValue returns the value of key, or "" if it was not recorded.
func (r *Results) MetaValue(key string) string {
	for _, m := range r.Meta {
		if m.Key == key {
			return m.Value
		}
	}
	return ""
}

// Section returns the named section, or nil.
func (r *Results) Section(name string) *Section {
	for _, s := range r.Sections {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// section returns the named section, adding it if it is new.
func (r *Results) section(name string) *Section {
	if s := r.Section(name); s != nil {
		return s
	}
	s := &Section{Name: name}
	r.Sections = append(r.Sections, s)
	return s
}

// Check returns the named check of the section, or false.
func (s *Section) Check(name string) (Check, bool) {
	for _, c := range s.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// Value returns the named measurement of the section, or false.
func (s *Section) Value(name string) (Value, bool) {
	for _, v := range s.Values {
		if v.Name == name {
			return v, true
		}
	}
	return Value{}, false
}

// Verdict sums the section up: SKIP or TIMEOUT or ERROR as it ended, else
// FAIL if any check failed, PASS if any passed, INFO otherwise.
func (s *Section) Verdict() Status {
	switch s.End {
	case Skip, Timeout, Error:
		return s.End
	}
	verdict := Info
	for _, c := range s.Checks {
		switch c.Status {
		case Fail:
			return Fail
		case Pass:
			verdict = Pass
		}
	}
	if s.End == "" && verdict != Fail {
		// It never said it ended: it was killed, or is still running.
		return Error
	}
	return verdict
}

// Parse reads a results file. It fails only if r cannot be read: a line it
// cannot make sense of goes to Malformed.
func Parse(r io.Reader) (*Results, error) {
	res := &Results{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := res.add(line); err != nil {
			res.Malformed = append(res.Malformed, fmt.Sprintf("line %d: %s (%v)", n, line, err))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read results: %w", err)
	}
	return res, nil
}

// add applies one line.
func (r *Results) add(line string) error {
	kind, rest, _ := strings.Cut(line, " ")
	switch kind {
	case "META":
		key, val, ok := strings.Cut(rest, " ")
		if !ok || key == "" {
			return fmt.Errorf("want META <key> <text>")
		}
		r.Meta = append(r.Meta, Meta{key, strings.TrimSpace(val)})
	case "SECTION":
		f := fields(rest, 4)
		if len(f) < 3 {
			return fmt.Errorf("want SECTION <section> <status> <seconds> [<why>]")
		}
		secs, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			return fmt.Errorf("seconds %q: %w", f[2], err)
		}
		st := Status(f[1])
		switch st {
		case Done, Skip, Timeout, Error:
		default:
			return fmt.Errorf("section status %q: want DONE, SKIP, TIMEOUT or ERROR", f[1])
		}
		s := r.section(f[0])
		s.End, s.Seconds = st, secs
		if len(f) == 4 {
			s.Why = f[3]
		}
	case "RUN", "NOTE":
		name, text, ok := strings.Cut(rest, " ")
		if !ok || name == "" || strings.TrimSpace(text) == "" {
			return fmt.Errorf("want %s <section> <text>", kind)
		}
		s := r.section(name)
		if kind == "RUN" {
			s.Runs = append(s.Runs, text)
		} else {
			s.Notes = append(s.Notes, text)
		}
	case "CHECK":
		f := fields(rest, 4)
		if len(f) < 3 {
			return fmt.Errorf("want CHECK <section> <name> <status> <seen>")
		}
		st := Status(f[2])
		switch st {
		case Pass, Fail, Skip, Info:
		default:
			return fmt.Errorf("check status %q: want PASS, FAIL, SKIP or INFO", f[2])
		}
		c := Check{Name: f[1], Status: st}
		if len(f) == 4 {
			c.Seen = f[3]
		}
		s := r.section(f[0])
		s.Checks = append(s.Checks, c)
	case "RESULT":
		f := fields(rest, 4)
		if len(f) < 3 {
			return fmt.Errorf("want RESULT <section> <name> <value> [<unit>]")
		}
		v := Value{Name: f[1], Text: f[2]}
		if x, err := strconv.ParseFloat(f[2], 64); err == nil {
			v.Num, v.IsNum = x, true
		}
		if len(f) == 4 && f[3] != "-" {
			v.Unit = f[3]
		}
		s := r.section(f[0])
		s.Values = append(s.Values, v)
	case "ATTACH":
		f := fields(rest, 4)
		if len(f) < 3 {
			return fmt.Errorf("want ATTACH <section> <format> <file> <title>")
		}
		if f[1] != "text" && f[1] != "markdown" {
			return fmt.Errorf("attachment format %q: want text or markdown", f[1])
		}
		if strings.HasPrefix(f[2], "/") || strings.Contains(f[2], "..") {
			return fmt.Errorf("attachment %q: want a path inside the results directory", f[2])
		}
		a := Attachment{Format: f[1], File: f[2], Title: f[2]}
		if len(f) == 4 {
			a.Title = f[3]
		}
		s := r.section(f[0])
		s.Attachments = append(s.Attachments, a)
	default:
		return fmt.Errorf("unknown record %q", kind)
	}
	return nil
}

// fields splits s into at most n space-separated fields, the last taking
// the rest of the line.
func fields(s string, n int) []string {
	var out []string
	s = strings.TrimSpace(s)
	for len(out) < n-1 && s != "" {
		f, rest, _ := strings.Cut(s, " ")
		out = append(out, f)
		s = strings.TrimLeft(rest, " ")
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

// Writer writes result lines for one section. Its methods keep each record
// on one line whatever the text holds.
type Writer struct {
	w       io.Writer
	section string
	prefix  string
	err     error
}

// NewWriter returns a Writer of lines for section to w.
func NewWriter(w io.Writer, section string) *Writer {
	return &Writer{w: w, section: token(section)}
}

// WithPrefix returns a Writer whose check and result names start with
// prefix, so that two runs of one kind (a program's two builds) stay apart
// in one section.
func (w *Writer) WithPrefix(prefix string) *Writer {
	if prefix != "" {
		prefix = token(prefix)
	}
	return &Writer{w: w.w, section: w.section, prefix: w.prefix + prefix}
}

// Err returns the first write error.
func (w *Writer) Err() error { return w.err }

// Check records a verdict and what was seen.
func (w *Writer) Check(name string, st Status, format string, args ...any) {
	w.line("CHECK", w.prefix+token(name), string(st), oneLine(fmt.Sprintf(format, args...)))
}

// Result records a measurement; unit may be empty.
func (w *Writer) Result(name string, value any, unit string) {
	var v string
	switch x := value.(type) {
	case float64:
		v = strconv.FormatFloat(x, 'f', -1, 64)
		if x != float64(int64(x)) {
			v = strconv.FormatFloat(x, 'f', 3, 64)
			v = strings.TrimRight(strings.TrimRight(v, "0"), ".")
		}
	default:
		v = fmt.Sprint(x)
	}
	if unit == "" {
		unit = "-"
	}
	w.line("RESULT", w.prefix+token(name), token(v), token(unit))
}

// Note records a remark.
func (w *Writer) Note(format string, args ...any) {
	w.line("NOTE", oneLine(fmt.Sprintf(format, args...)))
}

// line writes kind, the section and the fields as one line.
func (w *Writer) line(kind string, f ...string) {
	if w.err != nil {
		return
	}
	_, w.err = fmt.Fprintf(w.w, "%s %s %s\n", kind, w.section, strings.Join(f, " "))
}

// token makes s one field: spaces become underscores, and an empty
// string a dash.
func token(s string) string {
	s = strings.Join(strings.Fields(s), "_")
	if s == "" {
		return "-"
	}
	return s
}

// oneLine joins the lines of s with " / " and trims it.
func oneLine(s string) string {
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	out := strings.Join(lines, " / ")
	if out == "" {
		return "-"
	}
	return out
}
