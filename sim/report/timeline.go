package report

import (
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/gpu-arbiter/arbiter/sim"
)

// Timeline geometry (pixels).
const (
	tlPlotW = 640
	tlLaneH = 22 // a time-sliced GPU's row
	tlSubH  = 14 // one process's row of a spatially shared GPU
	tlGap   = 6
)

// Colours of the engine's own work in the timeline.
const (
	// tlMarkW is the least width (px) a switch or a save is drawn with.
	tlMarkW      = 1.5
	switchColour = "#888"
	saveColour   = "#000"
)

// WriteTimeline draws, for every baseline that recorded one, which process
// ran on each GPU's compute engine over the timeline window, with context
// switches and saves of preempted kernels; under spatial sharing (mps)
// each process has a row of its own, labelled, since their kernels co-run.
func (r *Report) WriteTimeline(w io.Writer, window uint64) error {
	c := &canvas{}
	var rows []*Baseline
	for i := range r.Baselines {
		if len(r.Baselines[i].Timeline) > 0 {
			rows = append(rows, &r.Baselines[i])
		}
	}
	u := unitFor(float64(max(window, 1)))
	c.text(10, 24, "start", fmt.Sprintf("GPU timeline: what each compute engine ran, first %s %s", u.label(float64(window)), u.name),
		14, ` font-weight="bold"`)
	if window == 0 {
		c.text(10, 50, "start", "no timeline recorded (the timeline window is 0)", fontSize, "")
		return c.writeTo(w)
	}
	if len(rows) == 0 {
		c.text(10, 50, "start", "no timeline recorded (exclusive runs each workload alone)", fontSize, "")
		return c.writeTo(w)
	}
	colour, names := timelineColours(rows)
	// Row labels first, to know how wide their column is.
	type lane struct {
		label string
		pid   uint32 // the process of a spatial sub-row, 0 for a whole GPU
		gpu   int
	}
	type block struct {
		b     *Baseline
		lanes []lane
	}
	var blocks []block
	labelW := 0.0
	for _, b := range rows {
		bl := block{b: b}
		for g := 0; g < r.GPUs; g++ {
			pids := spatialRows(b.Timeline, g)
			if pids == nil {
				bl.lanes = append(bl.lanes, lane{label: fmt.Sprintf("gpu %d", g), gpu: g})
				continue
			}
			for _, pid := range pids {
				bl.lanes = append(bl.lanes, lane{label: fmt.Sprintf("gpu %d · %s", g, nameOf(b, pid)), pid: pid, gpu: g})
			}
		}
		for _, l := range bl.lanes {
			labelW = max(labelW, textWidth(l.label, fontSize))
		}
		blocks = append(blocks, bl)
	}
	x0 := 10 + labelW + 10
	x := func(t uint64) float64 { return x0 + float64(min(t, window))/float64(window)*tlPlotW }
	yy := 40.0
	for _, bl := range blocks {
		c.text(10, yy+12, "start", bl.b.Name, fontSize, ` font-weight="bold"`)
		yy += 18
		for _, l := range bl.lanes {
			h := float64(tlLaneH)
			if l.pid != 0 {
				h = tlSubH
			}
			c.text(10, yy+h/2+4, "start", l.label, fontSize, "")
			c.rect(x0, yy, tlPlotW, h, `fill="#f4f4f4"`, "")
			// Runs first, then switches and saves over them, at least
			// tlMarkW wide where they stand apart: tens of microseconds
			// are under a pixel of a window of milliseconds, and would
			// not show between runs. A save and the switch that follows
			// it at once stand apart or not together, and are widened
			// side by side. Marks closer together than twice that are
			// not widened, or they would hide the runs between them:
			// they are drawn a pixel column at a time (pixelMarks).
			var marks []sim.Segment
			for _, seg := range bl.b.Timeline {
				if seg.GPU != l.gpu || seg.Start >= window || (l.pid != 0 && seg.PID != l.pid) {
					continue
				}
				if seg.Kind != sim.SegmentRun {
					marks = append(marks, seg)
					continue
				}
				c.rect(x(seg.Start), yy, max(x(seg.End)-x(seg.Start), 0.3), h, fmt.Sprintf(`fill="%s"`, colour[seg.PID]),
					fmt.Sprintf("%s %s–%s", nameOf(bl.b, seg.PID), dur(seg.Start), dur(seg.End)))
			}
			col := pixelMarks{col: -1}
			units := touching(marks)
			// Where each unit's marks would end, widened: a unit stands
			// apart where at least tlMarkW of run would show between it,
			// so drawn, and its neighbours.
			widened := make([]float64, len(units))
			for u, unit := range units {
				widened[u] = x(unit[0].Start)
				for _, seg := range unit {
					widened[u] += max(x(seg.End)-x(seg.Start), tlMarkW)
				}
			}
			for u, unit := range units {
				first := unit[0]
				apart := (u == 0 || x(first.Start)-widened[u-1] >= tlMarkW) &&
					(u == len(units)-1 || x(units[u+1][0].Start)-widened[u] >= tlMarkW)
				at := x(first.Start)
				for _, seg := range unit {
					fill, title := switchColour, "context switch to "+nameOf(bl.b, seg.PID)
					if seg.Kind == sim.SegmentPreempt {
						fill, title = saveColour, "save of a preempted kernel"
					}
					w := x(seg.End) - x(seg.Start)
					if !apart {
						col.add(c, x(seg.Start), w, seg.Kind == sim.SegmentPreempt, yy, h)
						continue
					}
					c.rect(at, yy, max(w, tlMarkW), h, fmt.Sprintf(`fill="%s"`, fill),
						fmt.Sprintf("%s %s–%s", title, dur(seg.Start), dur(seg.End)))
					at += max(w, tlMarkW)
				}
			}
			col.flush(c, yy, h)
			yy += h + 2
		}
		yy += tlGap
	}
	for _, t := range linTicks(float64(window), 8) {
		px := x(uint64(t))
		c.line(px, yy, px, yy+4, `stroke="#444"`)
		c.text(px, yy+16, "middle", u.label(t), fontSize, "")
	}
	c.text(x0+tlPlotW/2, yy+34, "middle", fmt.Sprintf("simulated time (%s)", u.name), fontSize, "")
	timelineLegend(c, names, 10, yy+56, x0+tlPlotW)
	return c.writeTo(w)
}

// touching splits marks (in time order) into runs of marks each of which
// begins where the one before it ends: a save and the switch after it.
func touching(marks []sim.Segment) [][]sim.Segment {
	var out [][]sim.Segment
	for i, m := range marks {
		if i > 0 && m.Start == marks[i-1].End {
			out[len(out)-1] = append(out[len(out)-1], m)
			continue
		}
		out = append(out, []sim.Segment{m})
	}
	return out
}

// pixelMarks gathers the switches and saves too close together to be
// widened (tens of them to a pixel where a timeslice is 50 µs), a pixel
// column at a time: each column gets one mark of each kind, as wide as
// the time they took in it, so that their share of the time shows and
// the runs between them too. Columns come in order: marks are in time
// order.
type pixelMarks struct {
	col             float64 // the column's left edge; -1 before the first
	switchW, saveW  float64
	switches, saves int
}

// add counts a mark at px, w pixels wide, a save or a switch, drawing the
// column before it if px starts a new one.
func (m *pixelMarks) add(c *canvas, px, w float64, save bool, y, h float64) {
	if col := math.Floor(px); col != m.col {
		m.flush(c, y, h)
		m.col = col
	}
	if save {
		m.saveW += w
		m.saves++
	} else {
		m.switchW += w
		m.switches++
	}
}

// flush draws the column gathered so far, if any.
func (m *pixelMarks) flush(c *canvas, y, h float64) {
	x := m.col
	if m.switchW+m.saveW < 0.05 {
		*m = pixelMarks{col: -1} // nothing a viewer could see
		return
	}
	if m.switches > 0 {
		c.rect(x, y, min(m.switchW, 1), h, fmt.Sprintf(`fill="%s"`, switchColour), fmt.Sprintf("%d context switches", m.switches))
		x += min(m.switchW, 1)
	}
	if m.saves > 0 {
		c.rect(x, y, min(m.saveW, 1), h, fmt.Sprintf(`fill="%s"`, saveColour), fmt.Sprintf("%d saves of preempted kernels", m.saves))
	}
	*m = pixelMarks{col: -1}
}

// timelineColours gives each process that ran a colour, by pid, and lists
// them for the legend.
func timelineColours(rows []*Baseline) (map[uint32]string, []legendKey) {
	var pids []uint32
	for _, b := range rows {
		for _, seg := range b.Timeline {
			if seg.Kind == sim.SegmentRun && !slices.Contains(pids, seg.PID) {
				pids = append(pids, seg.PID)
			}
		}
	}
	slices.Sort(pids)
	colour := map[uint32]string{}
	var keys []legendKey
	for i, pid := range pids {
		colour[pid] = palette[i%len(palette)]
		name := fmt.Sprint(pid)
		for _, b := range rows {
			if n, ok := b.PIDs[pid]; ok {
				name = n
			}
		}
		keys = append(keys, legendKey{name, colour[pid]})
	}
	return colour, append(keys, legendKey{"context switch", switchColour}, legendKey{"save of a preempted kernel", saveColour})
}

// legendKey is one entry of the timeline's legend.
type legendKey struct{ name, colour string }

// timelineLegend lays the keys out left to right from x, y, wrapping
// before right.
func timelineLegend(c *canvas, keys []legendKey, x, y, right float64) {
	lx, ly := x, y
	for _, k := range keys {
		w := 18 + textWidth(k.name, fontSize) + 16
		if lx > x && lx+w > right {
			lx, ly = x, ly+20
		}
		c.rect(lx, ly, 14, 14, fmt.Sprintf(`fill="%s"`, k.colour), "")
		c.text(lx+18, ly+12, "start", k.name, fontSize, "")
		lx += w
	}
}

// spatialRows returns the processes of a GPU's lane, in pid order, when
// their segments overlap (spatial sharing: kernels co-run), nil when the
// lane is one row.
func spatialRows(tl []sim.Segment, gpu int) []uint32 {
	var end uint64
	overlap := false
	var pids []uint32
	for _, seg := range tl {
		if seg.GPU != gpu {
			continue
		}
		if seg.Start < end {
			overlap = true
		}
		end = max(end, seg.End)
		if !slices.Contains(pids, seg.PID) {
			pids = append(pids, seg.PID)
		}
	}
	if !overlap {
		return nil
	}
	slices.Sort(pids)
	return pids
}

// nameOf names a pid in a baseline's timeline.
func nameOf(b *Baseline, pid uint32) string {
	if n, ok := b.PIDs[pid]; ok {
		return n
	}
	return fmt.Sprint(pid)
}

func (r *Report) lcNames() []string {
	var names []string
	for _, b := range r.Baselines {
		for _, l := range b.LC {
			if !slices.Contains(names, l.Name) {
				names = append(names, l.Name)
			}
		}
	}
	return names
}

func (b *Baseline) lc(name string) *LC {
	for i := range b.LC {
		if b.LC[i].Name == name {
			return &b.LC[i]
		}
	}
	return nil
}
