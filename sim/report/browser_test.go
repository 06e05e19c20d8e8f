package report

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/gpu-arbiter/arbiter/internal/consoletest"
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/hist"
)

// drawn is what a browser laid out of an SVG: its size, every text's box,
// every filled rectangle's box (bars, lanes, legend keys: not the white
// page or an unfilled frame) and every polyline's points, in pixels.
type drawn struct {
	W, H  float64
	Texts []struct {
		S                        string
		Left, Right, Top, Bottom float64
	}
	Rects []struct {
		Left, Right, Top, Bottom float64
	}
	Lines []string
}

// layoutJS measures the document in the page, as the browser set it in
// its own sans-serif font.
const layoutJS = `(() => {
  const svg = document.querySelector('svg');
  const box = (e) => { const r = e.getBoundingClientRect(); return {Left: r.left, Right: r.right, Top: r.top, Bottom: r.bottom}; };
  return {
    W: +svg.getAttribute('width'), H: +svg.getAttribute('height'),
    Texts: [...svg.querySelectorAll('text')].map((t) => Object.assign({S: t.textContent}, box(t))),
    Rects: [...svg.querySelectorAll('rect')].filter((r) => { const f = r.getAttribute('fill'); return f && f !== 'none' && f !== 'white'; }).map(box),
    Lines: [...svg.querySelectorAll('polyline')].map((p) => p.getAttribute('points')),
  };
})()`

// adversarial is a report made to crowd the plots: names of wide
// letters, in bold titles, legends and row labels; a baseline whose
// curve is exactly the reference's; a latency range of eight decades;
// spatially shared rows; marks of context switches denser than pixels.
func adversarial() *Report {
	wide := strings.Repeat("WM", 20) // 40 of the widest letters
	var narrow, spread hist.Histogram
	for v := uint64(1); v <= 2000; v++ {
		narrow.Record(2_000_000 + v*5_000)
		spread.Record(uint64(math.Pow(10, 3+8*float64(v)/2000))) // 1 µs to 100 s
	}
	lc := func(name string, h *hist.Histogram, lower bool) LC {
		return LC{Name: name, GPU: 0, Class: "lc", Arrived: h.Count(), Requests: h.Count(), P50NS: h.Quantile(0.5), P99NS: h.Quantile(0.99),
			P999NS: h.Quantile(0.999), LowerBound: lower, Latency: h}
	}
	var tl []sim.Segment
	for i := range uint64(2000) { // a switch every 500 ns of a 1 ms window
		tl = append(tl, sim.Segment{GPU: 0, PID: 1000 + uint32(i%2), Kind: sim.SegmentRun, Start: i * 500, End: i*500 + 480},
			sim.Segment{GPU: 0, PID: 1000 + uint32((i+1)%2), Kind: sim.SegmentSwitch, Start: i*500 + 480, End: i*500 + 500})
	}
	spatial := []sim.Segment{{GPU: 0, PID: 1000, Kind: sim.SegmentRun, Start: 0, End: 900_000}, {GPU: 0, PID: 1001, Kind: sim.SegmentRun, Start: 100_000, End: 800_000}}
	pids := map[uint32]string{1000: wide + "/0", 1001: "train-" + wide}
	base := func(name string, tl []sim.Segment, lcs ...LC) Baseline {
		return Baseline{Name: name, LC: lcs, Timeline: tl, PIDs: pids}
	}
	return &Report{Workload: "w", DurationNS: 1e9, GPUs: 1, Baselines: []Baseline{
		base("exclusive", nil, lc(wide, &narrow, false), lc("spread", &spread, false)),
		base("timeslice", tl, lc(wide, &narrow, true), lc("spread", &spread, false)),
		base("mps", spatial, lc(wide, &narrow, false)),
		base("priority-"+wide, tl, lc(wide, &narrow, false), lc("spread", &spread, true)),
	}}
}

// TestSVGLayoutInBrowser: the plots, set by a real browser in its own
// font (Chromium's sans-serif), keep every text inside the drawing, clear
// of every other text and of every bar, lane and legend key, and every
// curve clear of every text, even with names of the widest letters. The
// layout reserves room for text by an estimate of its width, which only
// a browser can check.
func TestSVGLayoutInBrowser(t *testing.T) {
	b := consoletest.New(t)
	r := adversarial()
	dir := t.TempDir()
	var lat, tl bytes.Buffer
	if err := r.WriteLatency(&lat); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteTimeline(&tl, 1_000_000); err != nil {
		t.Fatal(err)
	}
	wide := strings.Repeat("WM", 20)
	wants := map[string][]string{
		// 2,000 requests: guides at p99 and p99.9; eight decades of
		// latency (the spread workload): the powers of ten, each in its
		// own unit; a curve exactly the reference's is said to be.
		"latency.svg": {"p99", "p99.9", "1µs", "100ms", "100s", "request latency (log scale)", "request latency (ms, log scale)",
			"mps  p99 11.9ms (same curve as exclusive)", "timeslice  p99 ≥11.9ms, backlog (same curve as exclusive)"},
		"timeline.svg": {"gpu 0 · " + wide + "/0", "context switch"},
	}
	for name, data := range map[string][]byte{"latency.svg": lat.Bytes(), "timeline.svg": tl.Bytes()} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		b.Do(t, chromedp.Navigate("file://"+path))
		d := consoletest.Eval[drawn](t, b, layoutJS)
		if len(d.Texts) == 0 {
			t.Fatalf("%s: no text laid out", name)
		}
		var all []string
		for _, tx := range d.Texts {
			all = append(all, tx.S)
		}
		for _, want := range wants[name] {
			if !slices.Contains(all, want) {
				t.Errorf("%s lacks %q:\n%s", name, want, strings.Join(all, "\n"))
			}
		}
		const slack = 0.5 // px: anti-aliasing, rounding
		inside := func(l, r, t, b float64) bool { return l >= -slack && r <= d.W+slack && t >= -slack && b <= d.H+slack }
		overlap := func(l1, r1, t1, b1, l2, r2, t2, b2 float64) bool {
			return min(r1, r2)-max(l1, l2) > slack && min(b1, b2)-max(t1, t2) > slack
		}
		for i, tx := range d.Texts {
			if !inside(tx.Left, tx.Right, tx.Top, tx.Bottom) {
				t.Errorf("%s: %q at x %.1f–%.1f, y %.1f–%.1f leaves the %.0f×%.0f drawing", name, tx.S, tx.Left, tx.Right, tx.Top, tx.Bottom, d.W, d.H)
			}
			for _, o := range d.Texts[i+1:] {
				if overlap(tx.Left, tx.Right, tx.Top, tx.Bottom, o.Left, o.Right, o.Top, o.Bottom) {
					t.Errorf("%s: %q (x %.1f–%.1f, y %.1f–%.1f) overlaps %q (x %.1f–%.1f, y %.1f–%.1f)",
						name, tx.S, tx.Left, tx.Right, tx.Top, tx.Bottom, o.S, o.Left, o.Right, o.Top, o.Bottom)
				}
			}
			for _, rc := range d.Rects {
				if overlap(tx.Left, tx.Right, tx.Top, tx.Bottom, rc.Left, rc.Right, rc.Top, rc.Bottom) {
					t.Errorf("%s: %q (x %.1f–%.1f) runs into a bar or key at x %.1f–%.1f, y %.1f–%.1f", name, tx.S, tx.Left, tx.Right, rc.Left, rc.Right, rc.Top, rc.Bottom)
					break
				}
			}
			for _, pts := range d.Lines {
				if x, y, ok := crosses(pts, tx.Left+slack, tx.Right-slack, tx.Top+slack, tx.Bottom-slack); ok {
					t.Errorf("%s: a curve crosses %q at %.1f, %.1f", name, tx.S, x, y)
					break
				}
			}
		}
	}
}

// crosses reports a point of the polyline pts ("x,y x,y …") inside the
// box, walking each segment a pixel at a time.
func crosses(pts string, l, r, t, b float64) (x, y float64, ok bool) {
	var prev [2]float64
	for i, p := range strings.Fields(pts) {
		xs, ys, _ := strings.Cut(p, ",")
		px, err1 := strconv.ParseFloat(xs, 64)
		py, err2 := strconv.ParseFloat(ys, 64)
		if err1 != nil || err2 != nil {
			panic(fmt.Sprintf("polyline point %q", p))
		}
		if i > 0 {
			n := max(math.Ceil(math.Hypot(px-prev[0], py-prev[1])), 1)
			for k := 0.0; k <= n; k++ {
				x, y := prev[0]+(px-prev[0])*k/n, prev[1]+(py-prev[1])*k/n
				if x > l && x < r && y > t && y < b {
					return x, y, true
				}
			}
		}
		prev = [2]float64{px, py}
	}
	return 0, 0, false
}
