package report

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"slices"

	"github.com/gpu-arbiter/arbiter/sim"
)

// palette colours baselines and workloads (colour-blind-safe Tableau 10).
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

const (
	plotW, plotH   = 640, 260
	marginL        = 70
	marginR        = 170
	marginT        = 40
	marginB        = 50
	laneH, laneGap = 22, 6
)

// WriteCDF draws, for each LC workload, the latency CDF under every
// baseline on a logarithmic latency axis.
func (r *Report) WriteCDF(w io.Writer) error {
	bw := bufio.NewWriter(w)
	names := r.lcNames()
	panelH := plotH + marginT + marginB
	width := marginL + plotW + marginR
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n",
		width, max(1, len(names))*panelH)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	if len(names) == 0 {
		fmt.Fprintf(bw, `<text x="20" y="30">no latency-critical workloads</text>`+"\n")
	}
	for i, name := range names {
		oy := i * panelH
		lo, hi := math.Inf(1), 0.0
		for _, b := range r.Baselines {
			if l := b.lc(name); l != nil && len(l.CDF) > 0 {
				lo = min(lo, float64(max(l.CDF[0].Value, 1)))
				hi = max(hi, float64(l.CDF[len(l.CDF)-1].Value))
			}
		}
		if hi == 0 {
			continue
		}
		lx, hx := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if hx <= lx {
			hx = lx + 1
		}
		x := func(v float64) float64 {
			return marginL + (math.Log10(max(v, 1))-lx)/(hx-lx)*plotW
		}
		y := func(f float64) float64 { return float64(oy+marginT) + (1-f)*plotH }
		fmt.Fprintf(bw, `<text x="%d" y="%d" font-size="14" font-weight="bold">%s: request latency CDF</text>`+"\n",
			marginL, oy+24, html.EscapeString(name))
		axes(bw, marginL, oy+marginT)
		for e := lx; e <= hx; e++ {
			px := x(math.Pow(10, e))
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`, px, oy+marginT, px, oy+marginT+plotH)
			fmt.Fprintf(bw, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px, oy+marginT+plotH+16, dur(uint64(math.Pow(10, e))))
		}
		for _, f := range []float64{0, 0.5, 0.9, 0.99, 1} {
			fmt.Fprintf(bw, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", marginL-6, y(f)+4, f)
		}
		fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="middle">latency (log scale)</text>`+"\n", marginL+plotW/2, oy+marginT+plotH+36)
		for k, b := range r.Baselines {
			l := b.lc(name)
			if l == nil || len(l.CDF) == 0 {
				continue
			}
			c := palette[k%len(palette)]
			fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="2" points="`, c)
			prev := 0.0
			for _, p := range l.CDF {
				fmt.Fprintf(bw, "%.1f,%.1f %.1f,%.1f ", x(float64(p.Value)), y(prev), x(float64(p.Value)), y(p.Fraction))
				prev = p.Fraction
			}
			fmt.Fprintf(bw, `"/>`+"\n")
			ly := oy + marginT + 10 + 18*k
			fmt.Fprintf(bw, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/><text x="%d" y="%d">%s (p99 %s)</text>`+"\n",
				marginL+plotW+12, ly, marginL+plotW+30, ly, c, marginL+plotW+36, ly+4, html.EscapeString(b.Name), dur(l.P99NS))
		}
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

// WriteTimeline draws, for every baseline that recorded one, which process
// ran on each GPU's compute engine over the timeline window.
func (r *Report) WriteTimeline(w io.Writer, window uint64) error {
	bw := bufio.NewWriter(w)
	var rows []*Baseline
	for i := range r.Baselines {
		if len(r.Baselines[i].Timeline) > 0 {
			rows = append(rows, &r.Baselines[i])
		}
	}
	pids := map[uint32]int{}
	var names []string
	for _, b := range rows {
		for _, seg := range b.Timeline {
			if _, ok := pids[seg.PID]; !ok && seg.Kind == sim.SegmentRun {
				pids[seg.PID] = -1
			}
		}
	}
	order := make([]uint32, 0, len(pids))
	for pid := range pids {
		order = append(order, pid)
	}
	slices.Sort(order)
	for i, pid := range order {
		pids[pid] = i
		name := fmt.Sprint(pid)
		for _, b := range rows {
			if n, ok := b.PIDs[pid]; ok {
				name = n
			}
		}
		names = append(names, name)
	}
	lanes := 0
	for range rows {
		lanes += r.GPUs
	}
	height := marginT + lanes*(laneH+laneGap) + len(rows)*20 + marginB + 20*((len(names)+3)/4)
	width := marginL + plotW + 120
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(bw, `<text x="%d" y="24" font-size="14" font-weight="bold">GPU timeline, first %s</text>`+"\n", 10, dur(window))
	if len(rows) == 0 || window == 0 {
		fmt.Fprintf(bw, `<text x="10" y="50">no timeline recorded (exclusive runs each workload alone)</text></svg>`+"\n")
		return bw.Flush()
	}
	x := func(t uint64) float64 { return marginL + 40 + float64(t)/float64(window)*(plotW-40) }
	yy := marginT
	for _, b := range rows {
		fmt.Fprintf(bw, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", yy+12, html.EscapeString(b.Name))
		yy += 18
		for g := 0; g < r.GPUs; g++ {
			fmt.Fprintf(bw, `<text x="10" y="%d">gpu %d</text><rect x="%.1f" y="%d" width="%d" height="%d" fill="#f4f4f4"/>`+"\n",
				yy+15, g, x(0), yy, plotW-40, laneH)
			rowOf, rows := subLanes(b.Timeline, g)
			for _, seg := range b.Timeline {
				if seg.GPU != g || seg.Start >= window {
					continue
				}
				c := "#888"
				title := "context switch"
				switch seg.Kind {
				case sim.SegmentRun:
					i := pids[seg.PID]
					c, title = palette[i%len(palette)], names[i]
				case sim.SegmentPreempt:
					c, title = "#000", "preemption (context save)"
				}
				h := float64(laneH) / float64(rows)
				top := float64(yy) + h*float64(rowOf[seg.PID])
				wd := max(x(min(seg.End, window))-x(seg.Start), 0.3)
				fmt.Fprintf(bw, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s"><title>%s %s–%s</title></rect>`+"\n",
					x(seg.Start), top, wd, h, c, html.EscapeString(title), dur(seg.Start), dur(seg.End))
			}
			yy += laneH + laneGap
		}
	}
	for k := 0; k <= 4; k++ {
		t := window * uint64(k) / 4
		fmt.Fprintf(bw, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(t), yy+12, dur(t))
	}
	yy += 30
	for i, n := range names {
		lx := 10 + (i%4)*170
		ly := yy + (i/4)*20
		fmt.Fprintf(bw, `<rect x="%d" y="%d" width="14" height="14" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, ly, palette[i%len(palette)], lx+18, ly+12, html.EscapeString(n))
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

// subLanes splits a GPU's lane into one row per process when its segments
// overlap (spatial sharing: kernels of several processes co-run); otherwise
// everything is drawn in one row.
func subLanes(tl []sim.Segment, gpu int) (map[uint32]int, int) {
	rowOf := map[uint32]int{}
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
		return rowOf, 1
	}
	slices.Sort(pids)
	for i, pid := range pids {
		rowOf[pid] = i
	}
	return rowOf, len(pids)
}

func axes(w io.Writer, x0, y0 int) {
	fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", x0, y0, plotW, plotH)
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
