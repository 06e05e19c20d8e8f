package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/hist"
)

func sample() *Report {
	var h hist.Histogram
	for v := uint64(1); v <= 1000; v++ {
		h.Record(v * 10_000)
	}
	kept := 0.75
	l := LC{Name: "infer<&>", GPU: 0, Class: "lc", Arrived: 1001, Requests: 1000, InFlight: 1, P50NS: h.Quantile(0.5), P99NS: h.Quantile(0.99), P999NS: h.Quantile(0.999),
		P99Ratio: 2.5, SLOTargetNS: 5_000_000, SLOPercentile: 99, SLOJudged: 1000, Attainment: 0.5, CDF: h.CDF(50), Latency: &h}
	return &Report{Workload: "w", Seed: 3, DurationNS: 1e9, GPUs: 1, Baselines: []Baseline{
		{Name: "timeslice", LC: []LC{l}, BE: []BE{{Name: "train", Class: "be", Fraction: &kept}}, PreemptionsPerS: 12.5, GPUUtilization: 0.97,
			Timeline: []sim.Segment{{GPU: 0, PID: 1000, Kind: sim.SegmentRun, Start: 0, End: 500}, {GPU: 0, Kind: sim.SegmentPreempt, Start: 500, End: 530},
				{GPU: 0, PID: 1001, Kind: sim.SegmentSwitch, Start: 530, End: 550}},
			PIDs: map[uint32]string{1000: "infer<&>", 1001: "train"}},
	}}
}

func TestTable(t *testing.T) {
	var b bytes.Buffer
	if err := sample().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"workload w: 1 GPU, 1s simulated, seed 3", "timeslice", "5.01ms", "9.91ms", "2.50", "50.0%", "0.75", "12.5", "97.0%",
		"\npreempt/s and GPU util are each baseline's, over all its GPUs and workloads: on its first row\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for i, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("line %d ends in spaces: %q", i+1, line)
		}
	}
}

func TestJSON(t *testing.T) {
	var b bytes.Buffer
	if err := sample().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	l := back.Baselines[0].LC[0]
	if l.P99NS != sample().Baselines[0].LC[0].P99NS || len(l.CDF) != 50 || back.Baselines[0].BE[0].Fraction == nil || *back.Baselines[0].BE[0].Fraction != 0.75 {
		t.Errorf("round trip: %+v", back.Baselines[0])
	}
	if strings.Contains(b.String(), "timeline") || strings.Contains(b.String(), "Latency") {
		t.Error("JSON carries in-memory fields")
	}
}

// wellFormed parses an SVG as XML.
func wellFormed(t *testing.T, name string, data []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(data))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("%s: not well-formed XML: %v", name, err)
		}
	}
}

func TestSVG(t *testing.T) {
	r := sample()
	var lat, tl, empty bytes.Buffer
	if err := r.WriteLatency(&lat); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteTimeline(&tl, 1000); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "latency", lat.Bytes())
	wellFormed(t, "timeline", tl.Bytes())
	if !strings.Contains(lat.String(), "infer&lt;&amp;&gt;: share of requests slower than a latency") || !strings.Contains(lat.String(), "<polyline") {
		t.Errorf("latency: %.300s", lat.String())
	}
	if strings.Count(tl.String(), "<title>") != 3 || !strings.Contains(tl.String(), "save of a preempted kernel") {
		t.Errorf("timeline: %s", tl.String())
	}
	if err := (&Report{GPUs: 1}).WriteTimeline(&empty, 0); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "empty timeline", empty.Bytes())
}

// svgText is one text element of a drawing with its estimated box.
type svgText struct {
	s                      string
	left, right, top, base float64
}

// layout parses an SVG and returns its size and every text's box, from
// the same font metrics the drawing reserves room with.
func layout(t *testing.T, data []byte) (w, h float64, texts []svgText) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(data))
	var cur *xml.StartElement
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range e.Attr {
				attr[a.Name.Local] = a.Value
			}
			f := func(k string) float64 { v, _ := strconv.ParseFloat(attr[k], 64); return v }
			switch e.Name.Local {
			case "svg":
				w, h = f("width"), f("height")
			case "text":
				el := e.Copy()
				cur = &el
			}
		case xml.CharData:
			if cur == nil {
				continue
			}
			attr := map[string]string{}
			for _, a := range cur.Attr {
				attr[a.Name.Local] = a.Value
			}
			f := func(k string) float64 { v, _ := strconv.ParseFloat(attr[k], 64); return v }
			size := float64(fontSize)
			if attr["font-size"] != "" {
				size = f("font-size")
			}
			x, y, tw := f("x"), f("y"), textWidth(string(e), size)
			left := x
			switch attr["text-anchor"] {
			case "middle":
				left = x - tw/2
			case "end":
				left = x - tw
			}
			box := svgText{s: string(e), left: left, right: left + tw, top: y - size, base: y + size*0.3}
			if strings.HasPrefix(attr["transform"], "rotate(-90") {
				box = svgText{s: string(e), left: x - size, right: x + size*0.3, top: y - tw/2, base: y + tw/2}
			}
			texts = append(texts, box)
			cur = nil
		case xml.EndElement:
			cur = nil
		}
	}
}

// TestSVGLayout: every text of every plot fits inside the drawing, the
// latency legend sits right of its plot, and the plots carry what they
// promise: labelled axes, p99 and p99.9 guides, keys for switches and
// saves, labelled rows for co-running processes.
func TestSVGLayout(t *testing.T) {
	r := sample()
	long := r.Baselines[0]
	long.Name = "a-baseline-with-a-very-long-name-indeed"
	long.LC = append([]LC(nil), long.LC...)
	long.LC[0].LowerBound = true
	long.Timeline = []sim.Segment{{GPU: 0, PID: 1000, Kind: sim.SegmentRun, Start: 0, End: 700}, {GPU: 0, PID: 1001, Kind: sim.SegmentRun, Start: 100, End: 900}}
	r.Baselines = append(r.Baselines, long)
	check := func(name string, data []byte, wants ...string) {
		w, h, texts := layout(t, data)
		var all []string
		for _, tx := range texts {
			all = append(all, tx.s)
			if tx.left < 0 || tx.right > w || tx.top < 0 || tx.base > h {
				t.Errorf("%s: %q at [%.0f,%.0f]×[%.0f,%.0f] leaves the %.0f×%.0f drawing", name, tx.s, tx.left, tx.right, tx.top, tx.base, w, h)
			}
		}
		joined := strings.Join(all, "\n")
		for _, want := range wants {
			if !strings.Contains(joined, want) {
				t.Errorf("%s lacks %q:\n%s", name, want, joined)
			}
		}
	}
	var lat, tl bytes.Buffer
	if err := r.WriteLatency(&lat); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteTimeline(&tl, 1000); err != nil {
		t.Fatal(err)
	}
	check("latency", lat.Bytes(), "request latency (ms, log scale)", "share of requests slower (log scale)", "p99",
		"100%", "1%", "0.1%", "a-baseline-with-a-very-long-name-indeed  p99 ≥9.91ms, backlog (same curve as timeslice)", "timeslice  p99 9.91ms",
		"0.01", "0.02", "0.05", "1", "10")
	// 1,000 requests put the share axis's floor at 0.1%: no p99.9 guide
	// there, where it would lie on the frame and place nothing.
	if strings.Contains(lat.String(), ">p99.9<") {
		t.Error("a p99.9 guide on an axis whose floor is 0.1%")
	}
	check("timeline", tl.Bytes(), "simulated time (µs)", "context switch", "save of a preempted kernel", "gpu 0",
		"gpu 0 · infer<&>", "gpu 0 · train")
	_, _, texts := layout(t, lat.Bytes())
	for _, tx := range texts {
		if strings.HasPrefix(tx.s, "timeslice  p99") && tx.left < latLeft+latPlotW {
			t.Errorf("legend %q starts at %.0f, inside the plot (ends at %d)", tx.s, tx.left, latLeft+latPlotW)
		}
	}
}

// TestTicks: axes span the data on 1-2-5 values, in one unit.
func TestTicks(t *testing.T) {
	from, to, ticks := logTicks(2.3e6, 37.7e6)
	if from != 2e6 || to != 50e6 || fmt.Sprint(ticks) != "[2e+06 5e+06 1e+07 2e+07 5e+07]" {
		t.Errorf("log ticks %v–%v %v", from, to, ticks)
	}
	if _, _, ticks := logTicks(100, 1e12); len(ticks) > 12 || ticks[0] != 100 || ticks[len(ticks)-1] != 1e12 {
		t.Errorf("wide log ticks %v", ticks)
	}
	if ticks := linTicks(50e6, 8); fmt.Sprint(ticks) != "[0 1e+07 2e+07 3e+07 4e+07 5e+07]" {
		t.Errorf("linear ticks %v", ticks)
	}
	u := unitFor(50e6)
	if u.name != "ms" || u.label(5e5) != "0.5" || u.label(2e7) != "20" {
		t.Errorf("unit %v: %s %s", u, u.label(5e5), u.label(2e7))
	}
}

// TestTableNoRequests: a workload with no request completed reads n/a,
// not a latency of 0 and an SLO attainment of 0%.
func TestTableNoRequests(t *testing.T) {
	r := &Report{Workload: "w", DurationNS: 1e9, GPUs: 1, Baselines: []Baseline{{Name: "timeslice",
		LC: []LC{{Name: "idle", Class: "lc", SLOTargetNS: 5e6, SLOPercentile: 99, CDF: []hist.Point{}}}}}}
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	row := ""
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, "idle") {
			row = line
		}
	}
	f := strings.Fields(row)
	if len(f) < 11 || f[6] != "n/a" || f[7] != "n/a" || f[8] != "n/a" || f[10] != "n/a" {
		t.Errorf("row %q: want n/a for p50, p99, p99.9 and SLO", row)
	}
}

// TestTableHeader: the header gives the model and the closed loops'
// control latency with its source; exclusive's GPU utilization is
// explained in the table.
func TestTableHeader(t *testing.T) {
	r := sample()
	r.Model = Model{TimesliceNS: 1024000, ContextSwitchNS: 20000, PreemptionNS: 30000, Granularity: "instruction",
		ControlLatencyNS: 350000, ControlLatencySource: "default: RM PREEMPT"}
	ex := r.Baselines[0]
	ex.Name, ex.GPUUtilization = "exclusive", 1.2
	r.Baselines = append([]Baseline{ex}, r.Baselines...)
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"closed-loop control latency 350µs (default: RM PREEMPT)", "120.0%*",
		"* exclusive GPU util is the load the workloads offer"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestTimelineMarksShow: a context switch of 20 µs in a 50 ms window is
// well under a pixel; it is drawn at least tlMarkW wide, over the runs
// beside it, so that the legend's key has something to point at.
func TestTimelineMarksShow(t *testing.T) {
	r := &Report{GPUs: 1, Baselines: []Baseline{{Name: "timeslice", Timeline: []sim.Segment{
		{GPU: 0, PID: 1, Kind: sim.SegmentRun, Start: 0, End: 10_000_000},
		{GPU: 0, PID: 2, Kind: sim.SegmentSwitch, Start: 10_000_000, End: 10_020_000},
		{GPU: 0, PID: 2, Kind: sim.SegmentRun, Start: 10_020_000, End: 50_000_000},
	}}}}
	var b bytes.Buffer
	if err := r.WriteTimeline(&b, 50_000_000); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	sw := strings.Index(svg, "<title>context switch to ")
	last := strings.LastIndex(svg, "<title>2 10.0ms")
	if sw < 0 || last < 0 || sw < last {
		t.Fatalf("the switch is not drawn after the runs:\n%s", svg)
	}
	rect := svg[strings.LastIndex(svg[:sw], "<rect"):sw]
	var x, y, w float64
	if _, err := fmt.Sscanf(rect, `<rect x="%g" y="%g" width="%g"`, &x, &y, &w); err != nil || w < tlMarkW {
		t.Errorf("switch drawn %q (width %g, %v), want at least %g px", rect, w, err, tlMarkW)
	}
}

// TestTimelineSaveShows: a save and the switch that follows it at once,
// apart from other marks, are widened side by side, each at least tlMarkW:
// they touch, so neither stands apart from the other, and until they
// were taken together neither was widened (a save of 30 µs in a window of
// 70 ms drawn 0.4 px wide, invisible beside its switch).
func TestTimelineSaveShows(t *testing.T) {
	r := &Report{GPUs: 1, Baselines: []Baseline{{Name: "priority", Timeline: []sim.Segment{
		{GPU: 0, PID: 1, Kind: sim.SegmentRun, Start: 0, End: 10_000_000},
		{GPU: 0, Kind: sim.SegmentPreempt, Start: 10_000_000, End: 10_030_000},
		{GPU: 0, PID: 2, Kind: sim.SegmentSwitch, Start: 10_030_000, End: 10_050_000},
		{GPU: 0, PID: 2, Kind: sim.SegmentRun, Start: 10_050_000, End: 70_000_000},
	}}}}
	var b bytes.Buffer
	if err := r.WriteTimeline(&b, 70_000_000); err != nil {
		t.Fatal(err)
	}
	at := map[string][2]float64{}
	for _, line := range strings.Split(b.String(), "\n") {
		var x, y, w float64
		if _, err := fmt.Sscanf(line, `<rect x="%g" y="%g" width="%g"`, &x, &y, &w); err != nil {
			continue
		}
		for _, k := range []string{"<title>save of a preempted kernel", "<title>context switch to 2"} {
			if strings.Contains(line, k) {
				at[k] = [2]float64{x, w}
			}
		}
	}
	save, sw := at["<title>save of a preempted kernel"], at["<title>context switch to 2"]
	if save[1] < tlMarkW || sw[1] < tlMarkW || sw[0] < save[0]+save[1]-1e-9 {
		t.Errorf("save at %.2f px, %.2f wide; switch at %.2f px, %.2f wide: want each at least %g px, the switch after the save",
			save[0], save[1], sw[0], sw[1], tlMarkW)
	}
}

// TestTimelineCloseUnits: two save-and-switch pairs 3.5 px apart would,
// widened side by side (3 px each), leave under tlMarkW of the run
// between them: they are not widened, and the run shows.
func TestTimelineCloseUnits(t *testing.T) {
	const window = 70_000_000
	px := uint64(window / tlPlotW) // ns a pixel
	second := 10_000_000 + 7*px/2
	r := &Report{GPUs: 1, Baselines: []Baseline{{Name: "priority", Timeline: []sim.Segment{
		{GPU: 0, PID: 1, Kind: sim.SegmentRun, Start: 0, End: 10_000_000},
		{GPU: 0, Kind: sim.SegmentPreempt, Start: 10_000_000, End: 10_030_000},
		{GPU: 0, PID: 2, Kind: sim.SegmentSwitch, Start: 10_030_000, End: 10_050_000},
		{GPU: 0, PID: 2, Kind: sim.SegmentRun, Start: 10_050_000, End: second},
		{GPU: 0, Kind: sim.SegmentPreempt, Start: second, End: second + 30_000},
		{GPU: 0, PID: 1, Kind: sim.SegmentSwitch, Start: second + 30_000, End: second + 50_000},
		{GPU: 0, PID: 1, Kind: sim.SegmentRun, Start: second + 50_000, End: window},
	}}}}
	var b bytes.Buffer
	if err := r.WriteTimeline(&b, window); err != nil {
		t.Fatal(err)
	}
	var marks float64
	for _, line := range strings.Split(b.String(), "\n") {
		var x, y, w float64
		if _, err := fmt.Sscanf(line, `<rect x="%g" y="%g" width="%g"`, &x, &y, &w); err != nil {
			continue
		}
		if strings.Contains(line, "save") || strings.Contains(line, "switch") {
			marks += w
		}
	}
	if marks > 2 {
		t.Errorf("the two pairs' marks cover %.2f px: widened over the %.1f px of run between them", marks, 3.5-0.5)
	}
}

// TestTimelineDenseMarks: switches closer together than the least width
// a mark is drawn with are not widened, so that the runs between them
// still show (a BE timeslice of 50 µs in a window of 50 ms is under a
// pixel apart), but drawn a pixel column at a time, as wide as the time
// they took in it, so that they do not vanish either; a switch standing
// apart is still widened to show.
func TestTimelineDenseMarks(t *testing.T) {
	var tl []sim.Segment
	for i := range uint64(1000) { // a switch every 50 µs of the first 50 ms
		tl = append(tl, sim.Segment{GPU: 0, PID: 1 + uint32(i%2), Kind: sim.SegmentRun, Start: i * 50_000, End: i*50_000 + 45_000},
			sim.Segment{GPU: 0, PID: 1 + uint32((i+1)%2), Kind: sim.SegmentSwitch, Start: i*50_000 + 45_000, End: i*50_000 + 50_000})
	}
	tl = append(tl, sim.Segment{GPU: 0, PID: 1, Kind: sim.SegmentRun, Start: 50_000_000, End: 90_000_000},
		sim.Segment{GPU: 0, PID: 2, Kind: sim.SegmentSwitch, Start: 90_000_000, End: 90_020_000})
	r := &Report{GPUs: 1, Baselines: []Baseline{{Name: "timeslice", Timeline: tl}}}
	var b bytes.Buffer
	if err := r.WriteTimeline(&b, 100_000_000); err != nil {
		t.Fatal(err)
	}
	x0, first := -1.0, 0.0 // the plot's left edge; the first 50 ms's runs
	var marks float64
	isolated := false
	for _, line := range strings.Split(b.String(), "\n") {
		var x, y, w float64
		if _, err := fmt.Sscanf(line, `<rect x="%g" y="%g" width="%g"`, &x, &y, &w); err != nil || !strings.Contains(line, "<title>") {
			continue
		}
		if x0 < 0 {
			x0 = x
		}
		switch {
		case strings.Contains(line, "<title>context switch to 2 90.0ms"):
			isolated = true
			if w < tlMarkW {
				t.Errorf("a switch standing apart drawn %g px wide, want at least %g", w, tlMarkW)
			}
		case strings.Contains(line, "<title>context switch") || strings.Contains(line, " context switches</title>"):
			marks += w
		case x < x0+tlPlotW/2:
			first += w
		}
	}
	// The first 50 ms are 320 px, a tenth of them switching: the marks,
	// a column at a time, show that tenth.
	if !isolated || marks < 0.05*tlPlotW/2 || marks > 0.2*tlPlotW/2 || first < 0.7*tlPlotW/2 {
		t.Errorf("dense switches cover %.0f px and runs %.0f px of the first %d (isolated switch drawn: %v): want the runs to show",
			marks, first, tlPlotW/2, isolated)
	}
}

// TestReferenceCurveUnder: the reference curve (exclusive), drawn wide and
// pale, comes first in the document, under the others, wherever the
// baselines put it.
func TestReferenceCurveUnder(t *testing.T) {
	r := sample()
	ex := r.Baselines[0]
	ex.Name = "exclusive"
	r.Baselines = append(r.Baselines, ex) // exclusive last of the baselines
	var b bytes.Buffer
	if err := r.WriteLatency(&b); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	first := strings.Index(svg, "<polyline")
	if first < 0 || !strings.Contains(svg[first:first+200], `stroke-opacity="0.45"`) {
		t.Errorf("the first curve drawn is not the pale reference: %.200s", svg[max(first, 0):])
	}
}
