package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Latency plot geometry (pixels).
const (
	latPlotW, latPlotH = 560, 300
	latLeft            = 112 // room for the share labels and the guides' names
	latTop             = 40  // room for the title
	latPanelGap        = 80  // below a panel: tick labels and axis title
)

// WriteLatency draws, for each LC workload, the share of its requests
// slower than each latency (the complementary CDF) under every baseline,
// both axes logarithmic, so that the tail takes the room: 1% of requests
// sit two decades down, where p99 is read, with guides at p99 and p99.9.
// The latency axis spans the data on 1-2-5 ticks in one unit; lines of
// runs whose figures are lower bounds (a backlog at the end) are dashed.
func (r *Report) WriteLatency(w io.Writer) error {
	c := &canvas{}
	names := r.lcNames()
	if len(names) == 0 {
		c.text(20, 30, "start", "no latency-critical workloads", fontSize, "")
	}
	top := 0.0
	for _, name := range names {
		top = r.latencyPanel(c, name, top) + latPanelGap
	}
	return c.writeTo(w)
}

// ccdf is one baseline's curve: (latency ns, share of requests slower).
type ccdf struct {
	baseline string
	colour   string
	pts      [][2]float64
	n        uint64
	lc       *LC
}

// curves computes the curves of workload name, from the full histogram
// when the report has it, else from the thinned CDF of its JSON form.
func (r *Report) curves(name string) []ccdf {
	var out []ccdf
	for k := range r.Baselines {
		b := &r.Baselines[k]
		l := b.lc(name)
		if l == nil {
			continue
		}
		cv := ccdf{baseline: b.Name, colour: palette[k%len(palette)], lc: l}
		if h := l.Latency; h != nil && h.Count() > 0 {
			n, seen := h.Count(), uint64(0)
			cv.n = n
			h.Buckets(func(hi, count uint64) {
				seen += count
				cv.pts = append(cv.pts, [2]float64{float64(max(hi, 1)), float64(n-seen) / float64(n)})
			})
		} else {
			for _, p := range l.CDF {
				cv.pts = append(cv.pts, [2]float64{float64(max(p.Value, 1)), 1 - p.Fraction})
			}
			cv.n = l.Requests
		}
		if len(cv.pts) > 0 {
			out = append(out, cv)
		}
	}
	return out
}

// latencyPanel draws one workload's panel from y = top and returns the
// bottom of its plot area.
func (r *Report) latencyPanel(c *canvas, name string, top float64) float64 {
	cvs := r.curves(name)
	x0, y0 := float64(latLeft), top+latTop
	c.text(x0, top+24, "start", name+": share of requests slower than a latency", 14, ` font-weight="bold"`)
	if len(cvs) == 0 {
		c.text(x0, y0+20, "start", "no request completed under any baseline", fontSize, "")
		return y0 + 20
	}
	lo, hi := math.Inf(1), 0.0
	var n uint64
	for _, cv := range cvs {
		lo = min(lo, cv.pts[0][0])
		hi = max(hi, cv.pts[len(cv.pts)-1][0])
		n = max(n, cv.n)
	}
	from, to, ticks := logTicks(lo, hi)
	// The share axis goes down to the decade below one request in n.
	floor := math.Pow(10, -math.Ceil(math.Log10(float64(max(n, 1000)))))
	x := func(ns float64) float64 {
		return x0 + (math.Log10(ns)-math.Log10(from))/(math.Log10(to)-math.Log10(from))*latPlotW
	}
	y := func(share float64) float64 {
		return y0 + math.Log10(max(share, floor))/math.Log10(floor)*latPlotH
	}
	c.rect(x0, y0, latPlotW, latPlotH, `fill="none" stroke="#444"`, "")
	ticks, labels, unitName := latencyTicks(ticks, to, x)
	for i, t := range ticks {
		c.line(x(t), y0, x(t), y0+latPlotH, `stroke="#ddd"`)
		c.text(x(t), y0+latPlotH+20, "middle", labels[i], fontSize, "")
	}
	title := "request latency (log scale)"
	if unitName != "" {
		title = fmt.Sprintf("request latency (%s, log scale)", unitName)
	}
	c.text(x0+latPlotW/2, y0+latPlotH+40, "middle", title, fontSize, "")
	// The guides' names stand left of their share's label, outside the
	// plot, where no curve can run over them; a guide at the axis's
	// floor (too few requests to place it) is left out.
	for s := 1.0; s >= floor*0.99; s /= 10 {
		c.line(x0, y(s), x0+latPlotW, y(s), `stroke="#eee"`)
		label := percent(s)
		c.text(x0-6, y(s)+4, "end", label, fontSize, "")
		for _, g := range []struct {
			share float64
			name  string
		}{{0.01, "p99"}, {0.001, "p99.9"}} {
			if math.Abs(s/g.share-1) < 1e-6 && s > floor*1.01 {
				c.line(x0, y(s), x0+latPlotW, y(s), `stroke="#666" stroke-dasharray="4 3"`)
				c.text(x0-6-textWidth(label, fontSize)-8, y(s)+4, "end", g.name, 11, ` fill="#444"`)
			}
		}
	}
	c.vtext(16, y0+latPlotH/2, "share of requests slower (log scale)")
	// Every curve's pixels first, to find those drawn exactly over an
	// earlier one: the legend says so, or the hidden one would seem
	// missing. The reference (exclusive) is drawn wide and pale under
	// the others, so that a curve close to it does not hide it either.
	paths := make([][][2]float64, len(cvs))
	sameAs := make([]string, len(cvs))
	for i, cv := range cvs {
		paths[i] = stepPoints(cv.pts, x, y, from, floor)
		for j := range i {
			if slices.Equal(paths[i], paths[j]) {
				sameAs[i] = cvs[j].baseline
				break
			}
		}
	}
	for _, under := range []bool{true, false} {
		for i, cv := range cvs {
			if (cv.baseline == reference) == under {
				c.polyline(paths[i], curveStyle(cv, 2))
			}
		}
	}
	latencyLegend(c, cvs, sameAs, x0+latPlotW+16, y0+4)
	return y0 + latPlotH
}

// stepPoints turns (latency, share slower) points into the pixels of a
// step curve, starting at share 1 and dropping to the floor at the
// largest latency, thinned to one point per pixel step.
func stepPoints(pts [][2]float64, x func(float64) float64, y func(float64) float64, from, floor float64) [][2]float64 {
	out := [][2]float64{{x(max(pts[0][0], from)), y(1)}}
	add := func(px, py float64) {
		last := out[len(out)-1]
		if math.Abs(px-last[0]) < 0.5 && math.Abs(py-last[1]) < 0.5 {
			return
		}
		out = append(out, [2]float64{px, py})
	}
	prev := 1.0
	for _, p := range pts {
		px := x(p[0])
		add(px, y(prev))
		share := max(p[1], floor)
		add(px, y(share))
		prev = share
	}
	return slices.Clip(out)
}

// latencyTicks labels the latency axis's ticks, thinned until their
// labels stand clear of each other (to the powers of ten, then every
// other one), at pixel positions x. The labels share one unit, named in
// unitName, unless that unit would need exponents (an axis of many
// decades): then each label carries its own unit and unitName is "".
func latencyTicks(ticks []float64, to float64, x func(float64) float64) (kept []float64, labels []string, unitName string) {
	u := unitFor(to)
	label := func(ticks []float64) ([]string, string) {
		var out []string
		for _, t := range ticks {
			if l := u.label(t); !strings.Contains(l, "e") {
				out = append(out, l)
				continue
			}
			out = out[:0]
			for _, t := range ticks {
				tu := unitFor(t)
				out = append(out, tu.label(t)+tu.name)
			}
			return out, ""
		}
		return out, u.name
	}
	clear := func(ticks []float64, labels []string) bool {
		for i := 1; i < len(ticks); i++ {
			need := (textWidth(labels[i-1], fontSize)+textWidth(labels[i], fontSize))/2 + 8
			if x(ticks[i])-x(ticks[i-1]) < need {
				return false
			}
		}
		return true
	}
	labels, unitName = label(ticks)
	if !clear(ticks, labels) {
		ticks = decades(ticks)
		labels, unitName = label(ticks)
	}
	for len(ticks) > 2 && !clear(ticks, labels) {
		var every []float64
		for i, t := range ticks {
			if i%2 == 0 {
				every = append(every, t)
			}
		}
		ticks = every
		labels, unitName = label(ticks)
	}
	return ticks, labels, unitName
}

// reference is the baseline every other is compared with; its curve is
// drawn wide and pale, under the others.
const reference = "exclusive"

// curveStyle is the stroke of cv's curve (or legend key) of width w.
func curveStyle(cv ccdf, w float64) string {
	dash := ""
	if cv.lc.LowerBound {
		dash = ` stroke-dasharray="6 3"`
	}
	if cv.baseline == reference {
		return fmt.Sprintf(`stroke="%s" stroke-width="%s" stroke-opacity="0.45"%s`, cv.colour, num(w*3), dash)
	}
	return fmt.Sprintf(`stroke="%s" stroke-width="%s"%s`, cv.colour, num(w), dash)
}

// latencyLegend lists the baselines with their p99, right of the plot;
// sameAs names, for a curve drawn exactly over an earlier one, that one.
func latencyLegend(c *canvas, cvs []ccdf, sameAs []string, lx, ly float64) {
	for i, cv := range cvs {
		yy := ly + float64(i)*20
		c.line(lx, yy, lx+22, yy, curveStyle(cv, 3))
		p99 := "p99 " + dur(cv.lc.P99NS)
		if cv.lc.LowerBound {
			p99 = "p99 ≥" + dur(cv.lc.P99NS) + ", backlog"
		}
		if sameAs[i] != "" {
			p99 += " (same curve as " + sameAs[i] + ")"
		}
		c.text(lx+28, yy+4, "start", cv.baseline+"  "+p99, fontSize, "")
	}
}

// percent formats a share of the y axis.
func percent(s float64) string {
	v := s * 100
	if v >= 1 {
		return fmt.Sprintf("%.0f%%", v)
	}
	return fmt.Sprintf("%g%%", math.Round(v*1e6)/1e6)
}
