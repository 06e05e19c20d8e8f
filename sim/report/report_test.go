package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
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
	l := LC{Name: "infer<&>", GPU: 0, Class: "lc", Arrived: 1001, Requests: 1000, InFlight: 1, P50NS: h.Quantile(0.5), P99NS: h.Quantile(0.99), P999NS: h.Quantile(0.999),
		P99Ratio: 2.5, SLOTargetNS: 5_000_000, SLOPercentile: 99, SLOJudged: 1000, Attainment: 0.5, CDF: h.CDF(50), Latency: &h}
	return &Report{Workload: "w", Seed: 3, DurationNS: 1e9, GPUs: 1, Baselines: []Baseline{
		{Name: "timeslice", LC: []LC{l}, BE: []BE{{Name: "train", Class: "be", Fraction: 0.75}}, PreemptionsPerS: 12.5, GPUUtilization: 0.97,
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
	for _, want := range []string{"workload w: 1 GPU(s), 1s simulated, seed 3", "timeslice", "5.01ms", "9.91ms", "2.50", "50.0%", "0.75", "12.5", "97.0%"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
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
	if l.P99NS != sample().Baselines[0].LC[0].P99NS || len(l.CDF) != 50 || back.Baselines[0].BE[0].Fraction != 0.75 {
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
	var cdf, tl, empty bytes.Buffer
	if err := r.WriteCDF(&cdf); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteTimeline(&tl, 1000); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "cdf", cdf.Bytes())
	wellFormed(t, "timeline", tl.Bytes())
	if !strings.Contains(cdf.String(), "infer&lt;&amp;&gt;: request latency CDF") || !strings.Contains(cdf.String(), "<polyline") {
		t.Errorf("cdf: %.300s", cdf.String())
	}
	if strings.Count(tl.String(), "<title>") != 3 || !strings.Contains(tl.String(), "preemption") {
		t.Errorf("timeline: %s", tl.String())
	}
	if err := (&Report{GPUs: 1}).WriteTimeline(&empty, 0); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "empty timeline", empty.Bytes())
}
