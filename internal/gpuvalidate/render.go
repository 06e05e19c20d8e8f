package gpuvalidate

import (
	"fmt"
	"io"
	"io/fs"
	"math"
	"slices"
	"strings"
)

// RenderOptions configure Render.
type RenderOptions struct {
	// Files holds the attachments (the results directory); nil leaves
	// them out.
	Files fs.FS
	// MaxAttachmentLines keeps the last lines of a text attachment (zero:
	// 200).
	MaxAttachmentLines int
}

// Render writes res as Markdown ready to go under "## Runs" in
// docs/gpu-validation.md: a heading naming the date and the GPU, the
// machine, a summary table, then per section what it checks, what it ran,
// its checks with what was seen, its measurements and its raw output.
func Render(out io.Writer, res *Results, opts *RenderOptions) error {
	if opts == nil {
		opts = &RenderOptions{}
	}
	md := &mdWriter{w: out}
	stub := res.MetaValue("mode") != "" && res.MetaValue("mode") != "hardware"
	date := res.MetaValue("date")
	if d, _, ok := strings.Cut(date, "T"); ok {
		date = d
	}
	if date == "" {
		date = "undated"
	}
	switch {
	case stub:
		md.printf("### %s — %s (not a hardware result)\n\n", date, res.MetaValue("mode"))
		md.printf("> This run used the stub CUDA driver and the stand-in control file: it checks the procedure and its report, not a GPU.\n\n")
	default:
		used := res.MetaValue("gpu_used")
		if used == "" {
			used = "0"
		}
		gpu := res.MetaValue("gpu." + used)
		if g := res.MetaValue("gpu"); g != "" {
			gpu = g
		}
		md.printf("### %s — %s, driver %s\n\n", date, orDash(firstField(gpu, ",")), orDash(res.MetaValue("driver")))
	}
	renderMeta(md, res)
	md.printf("#### Summary\n\n| section | result | checks | time |\n|---|---|---|---|\n")
	for _, s := range res.Sections {
		title, _ := describe(s.Name)
		md.printf("| %s | %s | %s | %s |\n", cell(title), s.Verdict(), countChecks(s), seconds(s.Seconds))
	}
	md.printf("\n")
	for _, s := range res.Sections {
		renderSection(md, s, opts)
	}
	if len(res.Malformed) > 0 {
		md.printf("#### Lines the report could not read\n\n```\n%s\n```\n\n", strings.Join(res.Malformed, "\n"))
	}
	return md.err
}

// metaLabels are the machine facts in the order the report shows them.
var metaLabels = [...]struct{ key, label string }{
	{"date", "Date"},
	{"host", "Host"},
	{"kernel", "Kernel"},
	{"os", "OS"},
	{"gpu", "GPU"},
	{"gpu_used", "GPU used"},
	{"driver", "Driver"},
	{"gsp", "GSP firmware"},
	{"cuda_driver", "CUDA (driver)"},
	{"nvcc", "CUDA toolkit (nvcc)"},
	{"torch", "PyTorch"},
	{"compute_policy", "Compute policy"},
	{"arbiter", "Arbiter"},
	{"mode", "Mode"},
	{"procedure", "Procedure"},
	{"elapsed", "Time"},
}

// renderMeta writes the machine and the run as a two-column table.
func renderMeta(md *mdWriter, res *Results) {
	md.printf("| | |\n|---|---|\n")
	shown := map[string]bool{}
	for _, l := range metaLabels {
		if l.key == "gpu" {
			for _, m := range res.Meta {
				if m.Key == "gpu" || strings.HasPrefix(m.Key, "gpu.") {
					md.printf("| GPU %s | %s |\n", strings.TrimPrefix(strings.TrimPrefix(m.Key, "gpu"), "."), cell(m.Value))
					shown[m.Key] = true
				}
			}
			continue
		}
		if v := res.MetaValue(l.key); v != "" {
			md.printf("| %s | %s |\n", l.label, cell(v))
			shown[l.key] = true
		}
	}
	for _, m := range res.Meta {
		if !shown[m.Key] {
			md.printf("| %s | %s |\n", cell(m.Key), cell(m.Value))
			shown[m.Key] = true
		}
	}
	md.printf("\n")
}

// renderSection writes one section.
func renderSection(md *mdWriter, s *Section, opts *RenderOptions) {
	title, what := describe(s.Name)
	md.printf("#### %s — %s\n\n", title, s.Verdict())
	if what != "" {
		md.printf("%s\n\n", what)
	}
	switch s.End {
	case Skip:
		md.printf("**Skipped:** %s\n\n", orDash(s.Why))
	case Timeout, Error:
		md.printf("**%s:** %s\n\n", s.End, orDash(s.Why))
	}
	if len(s.Runs) > 0 {
		md.printf("Ran:\n\n```sh\n")
		var shown []string
		for _, r := range s.Runs {
			if !slices.Contains(shown, r) {
				shown = append(shown, r)
				md.printf("%s\n", r)
			}
		}
		md.printf("```\n\n")
	}
	if len(s.Checks) > 0 {
		md.printf("| check | result | seen |\n|---|---|---|\n")
		for _, c := range s.Checks {
			md.printf("| %s | %s | %s |\n", cell(c.Name), c.Status, cell(c.Seen))
		}
		md.printf("\n")
	}
	renderValues(md, s.Values)
	for _, n := range s.Notes {
		md.printf("- %s\n", n)
	}
	if len(s.Notes) > 0 {
		md.printf("\n")
	}
	for _, a := range s.Attachments {
		renderAttachment(md, a, opts)
	}
}

// renderValues writes the measurements: those named NAME.p50, NAME.p99
// and NAME.max as one row per NAME, the others one per row.
func renderValues(md *mdWriter, values []Value) {
	type row struct {
		name string
		q    [3]string
	}
	var pct []*row
	var plain []Value
	for _, v := range values {
		base, q, _ := cutLast(v.Name, ".")
		i := -1
		for j, name := range quantiles {
			if q == name {
				i = j
			}
		}
		if i < 0 {
			plain = append(plain, v)
			continue
		}
		var r *row
		for _, p := range pct {
			if p.name == base {
				r = p
			}
		}
		if r == nil {
			r = &row{name: base}
			pct = append(pct, r)
		}
		r.q[i] = formatValue(v)
	}
	if len(pct) > 0 {
		md.printf("| measure | p50 | p99 | max |\n|---|---|---|---|\n")
		for _, r := range pct {
			md.printf("| %s | %s | %s | %s |\n", cell(r.name), orDash(r.q[0]), orDash(r.q[1]), orDash(r.q[2]))
		}
		md.printf("\n")
	}
	if len(plain) > 0 {
		md.printf("| measure | value |\n|---|---|\n")
		for _, v := range plain {
			md.printf("| %s | %s |\n", cell(v.Name), cell(formatValue(v)))
		}
		md.printf("\n")
	}
}

// renderAttachment writes a file kept with the results in a collapsed
// block.
func renderAttachment(md *mdWriter, a Attachment, opts *RenderOptions) {
	if opts.Files == nil {
		return
	}
	md.printf("<details><summary>%s</summary>\n\n", a.Title)
	b, err := fs.ReadFile(opts.Files, a.File)
	switch {
	case err != nil:
		md.printf("(%s could not be read: %v)\n\n", a.File, err)
	case a.Format == "markdown":
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "#") {
				line = "##" + line
			}
			md.printf("%s", line)
		}
		md.printf("\n\n")
	default:
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		max := opts.MaxAttachmentLines
		if max <= 0 {
			max = 200
		}
		if len(lines) > max {
			md.printf("(last %d of %d lines)\n\n", max, len(lines))
			lines = lines[len(lines)-max:]
		}
		md.printf("```\n%s\n```\n\n", strings.ReplaceAll(strings.Join(lines, "\n"), "```", "'''"))
	}
	md.printf("</details>\n\n")
}

// formatValue writes a measurement in its unit: µs as µs, ms or s.
func formatValue(v Value) string {
	if !v.IsNum {
		return strings.TrimSpace(v.Text + " " + v.Unit)
	}
	switch v.Unit {
	case "us":
		return formatMicros(v.Num)
	case "ns":
		return fmt.Sprintf("%.0f ns", v.Num)
	case "x":
		return fmt.Sprintf("%.2f×", v.Num)
	case "":
		return v.Text
	}
	if v.Num == math.Trunc(v.Num) {
		return fmt.Sprintf("%.0f %s", v.Num, v.Unit)
	}
	return fmt.Sprintf("%.1f %s", v.Num, v.Unit)
}

// formatMicros writes µs with three significant digits in a fitting unit.
func formatMicros(us float64) string {
	switch a := math.Abs(us); {
	case a < 10:
		return fmt.Sprintf("%.2f µs", us)
	case a < 1000:
		return fmt.Sprintf("%.0f µs", us)
	case a < 1e6:
		return fmt.Sprintf("%.2f ms", us/1e3)
	default:
		return fmt.Sprintf("%.2f s", us/1e6)
	}
}

// countChecks sums a section's checks up by verdict.
func countChecks(s *Section) string {
	n := map[Status]int{}
	for _, c := range s.Checks {
		n[c.Status]++
	}
	var parts []string
	for _, st := range []Status{Pass, Fail, Skip, Info} {
		if n[st] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[st], strings.ToLower(string(st))))
		}
	}
	return orDash(strings.Join(parts, ", "))
}

// seconds writes a section's duration.
func seconds(s float64) string {
	switch {
	case s <= 0:
		return "-"
	case s < 60:
		return fmt.Sprintf("%.0f s", s)
	default:
		return fmt.Sprintf("%d min %02d s", int(s)/60, int(s)%60)
	}
}

// cell makes s safe in a table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// orDash returns s, or "-" where it is empty.
func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

// firstField returns s up to sep.
func firstField(s, sep string) string {
	f, _, _ := strings.Cut(s, sep)
	return strings.TrimSpace(f)
}

// cutLast splits s around its last sep.
func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// mdWriter writes formatted text and keeps the first error.
type mdWriter struct {
	w   io.Writer
	err error
}

func (m *mdWriter) printf(format string, args ...any) {
	if m.err == nil {
		_, m.err = fmt.Fprintf(m.w, format, args...)
	}
}

// describe returns a section's title and what it checks, as the report
// explains it to a reader who has not seen the script.
func describe(name string) (title, what string) {
	switch name {
	case "build":
		return "Build", "Compiles the validation's CUDA programs on this machine with nvcc: the capture program (twice: legacy and per-thread default stream), the channel-control victim (one thread spinning on the GPU global timer, its progress in host-mapped memory) and the co-location workloads."
	case "capture-cuda":
		return "Capture: a CUDA C program on real libcuda", "Traces a CUDA C program with `arbiter trace --format json --pid`, the trace attached before the program starts. The program makes a known number of launches (kernel, `cudaLaunchKernelEx`, cooperative, graph), copies and synchronizing calls and prints them; every one must be captured. Its per-thread-stream build must show the `_ptsz`/`_ptds` forms. Then the same back-to-back launch loop, untraced and traced, gives the probes' cost per launch."
	case "capture-torch":
		return "Capture: PyTorch", "Traces a PyTorch inference loop (a small MLP on the GPU: copy in, forward, copy out, synchronize) with `arbiter trace`. PyTorch makes calls of its own, so each count is a lower bound. Its per-request latency is printed for reference."
	case "nvrm":
		return "RM allocations and channel controls (nvrm's procedure)", "Runs nvrm's TestGPUValidate (`nvrm.test`) against a victim spinning on the GPU: the eBPF tracer records the victim's CUDA context creation (RM allocation sequence, channel groups and their engines, CUDA's own controls); then this process controls the victim's channel groups through pidfd_getfd: GET_INFO, SET/GET_TIMESLICE over a range of values, SET_INTERLEAVE_LEVEL (read back only from the registry's record, as GET_INTERLEAVE_LEVEL is not exported), suspend and resume over many trials with the time until the kernel stops and restarts, disable-only and preempt-only variants, and the victim's own check of its work after it all."
	case "channels":
		return "Channel control from the command line", "Runs the `arbiter channels` commands an operator would, on a victim started while `arbiter channels watch` traced: watch, list, timeslice, interleave low/high/medium, repeated `suspend --for` (per suspend method where the command offers several) and resume; the victim watches its own kernel and reports each stall, so every suspension is seen to stop it."
	case "colocate":
		return "Co-location of a latency-critical and a best-effort process", "Runs a latency-critical workload (requests: copy in, a few short kernels, copy out, synchronize, at a Poisson rate) and a best-effort one (long kernels back to back) alone, side by side with the driver's defaults, and side by side under Arbiter's channel controls applied with `arbiter channels`: BE timeslice tiny and LC long, interleave levels, BE suspended for the LC's run."
	case "daemon":
		return "The daemon: arbiter run with PyTorch inference and training", "Runs a PyTorch inference loop (latency-critical: Poisson requests of copy in, an MLP's forward pass in half precision, copy out, synchronize) and a PyTorch training loop (best-effort: an MLP in bfloat16 with AdamW) alone, side by side without Arbiter, and side by side under `arbiter run` with a policy that puts the training at each enforcement level in turn (observe, timeslice, suspend, gate). The BE's rate is taken over the LC's measured window. Each daemon run is checked: both processes classified, the holds its level implies made, no enforcement error, a clean exit on SIGTERM."
	}
	return name, ""
}
