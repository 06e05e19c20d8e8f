package report

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable prints the comparison table: a header with the run and the
// model, a row per workload and baseline, and footnotes that explain
// flagged rows and figures whose meaning differs by baseline.
func (r *Report) WriteTable(w io.Writer) error {
	gpus := "GPUs"
	if r.GPUs == 1 {
		gpus = "GPU"
	}
	fmt.Fprintf(w, "workload %s: %d %s, %v simulated, seed %d\n", r.Workload, r.GPUs, gpus, time.Duration(r.DurationNS), r.Seed)
	m := &r.Model
	fmt.Fprintf(w, "model: timeslice %s, context switch %s, preemption %s (%s granularity)",
		dur(m.TimesliceNS), dur(m.ContextSwitchNS), dur(m.PreemptionNS), m.Granularity)
	if m.ControlLatencySource != "" {
		fmt.Fprintf(w, "; closed-loop control latency %s (%s)", dur(m.ControlLatencyNS), m.ControlLatencySource)
	}
	fmt.Fprint(w, "\n\n")
	// The rows go through a buffer, to drop the padding of the empty
	// cells at the end of a baseline's later rows.
	var rows bytes.Buffer
	tw := tabwriter.NewWriter(&rows, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "baseline\tworkload\tclass\tarrived\tdone\twaiting\tp50\tp99\tp99.9\tp99/excl\tSLO\tBE thru/excl\tpreempt/s\tGPU util\t")
	var notes []string
	offered, unbalanced, shared := false, false, false
	for _, b := range r.Baselines {
		shared = shared || len(b.LC)+len(b.BE) > 1
		first := true
		common := func() string {
			if !first {
				return "\t\t"
			}
			first = false
			util := fmt.Sprintf("%.1f%%", 100*b.GPUUtilization)
			if b.Name == "exclusive" {
				util += "*"
				offered = true
			}
			return fmt.Sprintf("%.1f\t%s\t", b.PreemptionsPerS, util)
		}
		for _, l := range b.LC {
			name := l.Name
			if l.Backlog {
				name += "!"
				notes = append(notes, backlogNote(b.Name, &l))
			}
			if l.InFlight+l.Rejected > 0 {
				unbalanced = true
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t-\t%s\n", b.Name, name, l.Class, l.Arrived, l.Requests, l.Waiting,
				latency(&l, l.P50NS), latency(&l, l.P99NS), latency(&l, l.P999NS), bound(&l, ratio(l.P99Ratio)), slo(&l), common())
		}
		for _, e := range b.BE {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t%s\n", b.Name, e.Name, e.Class, fraction(e.Fraction), common())
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for line := range bytes.Lines(rows.Bytes()) {
		if _, err := fmt.Fprintf(w, "%s\n", bytes.TrimRight(line, " \n")); err != nil {
			return err
		}
	}
	if len(notes) > 0 || offered || unbalanced || shared {
		fmt.Fprintln(w)
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	if unbalanced {
		fmt.Fprintln(w, "arrived = done + waiting + in service at the end + turned away (max_pending); report.json (--out, --format json) has each count")
	}
	if shared {
		fmt.Fprintln(w, "preempt/s and GPU util are each baseline's, over all its GPUs and workloads: on its first row")
	}
	if offered {
		fmt.Fprintln(w, "* exclusive GPU util is the load the workloads offer: their solo runs' GPU time over GPUs × duration,")
		fmt.Fprintln(w, "  each solo run at most its whole GPU (one that cannot keep up alone asks more than it counts for);")
		_, err := fmt.Fprintln(w, "  above 100% they ask more than the GPUs have, and sharing must slow someone down.")
		return err
	}
	return nil
}

// backlogNote explains a flagged row.
func backlogNote(baseline string, l *LC) string {
	var b strings.Builder
	fmt.Fprintf(&b, "! %s/%s: %s of %s requests not served at the end (oldest waiting %s)", baseline, l.Name,
		count(l.Arrived-l.Requests), count(l.Arrived), dur(l.OldestUnservedNS))
	if l.Rejected > 0 {
		fmt.Fprintf(&b, ", %s of them turned away (max_pending)", count(l.Rejected))
	}
	b.WriteString("; latencies count the unserved at their age at the end: lower bounds (≥)")
	switch miss := l.UnservedLate + l.Rejected; {
	case miss == 0 || l.SLOTargetNS == 0:
	case l.Rejected == 0:
		fmt.Fprintf(&b, "; %s past the SLO target count as misses", count(miss))
	case l.UnservedLate == 0:
		fmt.Fprintf(&b, "; the %s turned away count as misses", count(miss))
	default:
		fmt.Fprintf(&b, "; %s turned away or past the SLO target count as misses", count(miss))
	}
	return b.String()
}

// latency formats one latency figure of a row: n/a without requests, ≥
// for a lower bound.
func latency(l *LC, ns uint64) string {
	if l.Requests == 0 && !l.LowerBound {
		return "n/a"
	}
	return bound(l, dur(ns))
}

// bound marks a figure of a row whose latencies are lower bounds.
func bound(l *LC, s string) string {
	if l.LowerBound && s != "-" {
		return "≥" + s
	}
	return s
}

// slo formats a row's SLO attainment: - without an SLO, n/a without a
// judged request.
func slo(l *LC) string {
	switch {
	case l.SLOTargetNS == 0:
		return "-"
	case l.SLOJudged == 0:
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*l.Attainment)
}

// dur formats a duration with three significant figures in the largest
// unit that keeps it at or above 1.
func dur(ns uint64) string {
	v := float64(ns)
	switch {
	case ns >= 10_000_000_000:
		return fmt.Sprintf("%.1fs", v/1e9)
	case ns >= 1_000_000_000:
		return fmt.Sprintf("%.2fs", v/1e9)
	case ns >= 10_000_000:
		return fmt.Sprintf("%.1fms", v/1e6)
	case ns >= 1_000_000:
		return fmt.Sprintf("%.2fms", v/1e6)
	case ns >= 1_000:
		return fmt.Sprintf("%.0fµs", v/1e3)
	}
	return fmt.Sprintf("%dns", ns)
}

// fraction formats a best-effort workload's share of its exclusive
// throughput: "-" where there is nothing to compare with, 0.00 where the
// baseline starved it.
func fraction(f *float64) string {
	if f == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *f)
}

func ratio(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// count formats n with thousands separators.
func count(n uint64) string {
	s := strconv.FormatUint(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
