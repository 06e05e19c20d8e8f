package gpuvalidate

import (
	"bytes"
	"strings"
	"testing"
)

// TestParseWorkload reads the summary lines of the stub's workloads and
// of the validation's CUDA and PyTorch programs.
func TestParseWorkload(t *testing.T) {
	w, err := ParseWorkload(strings.NewReader(`torch: 2.5.1 CUDA 12.4 on NVIDIA H100 80GB HBM3
calls: launches>=200 copies>=400 syncs=200
infer: 200 requests in 1.25 s: p50 512 us, p99 1480 us, max 2210 us
`))
	if err != nil {
		t.Fatal(err)
	}
	if !w.Latency || w.Requests != 200 || w.Seconds != 1.25 || w.P50 != 512 || w.P99 != 1480 || w.MaxLat != 2210 || w.Throughput {
		t.Errorf("latency: %+v", w)
	}
	want := []Expectation{{"launches", 200, true}, {"copies", 400, true}, {"syncs", 200, false}}
	if len(w.Calls) != 3 || w.Calls[0] != want[0] || w.Calls[1] != want[1] || w.Calls[2] != want[2] {
		t.Errorf("calls: %+v", w.Calls)
	}
	if w.Calls[0].String() != "launches>=200" || w.Calls[2].String() != "syncs=200" {
		t.Errorf("strings: %s %s", w.Calls[0], w.Calls[2])
	}
	if len(w.Other) != 1 || !strings.HasPrefix(w.Other[0], "torch: 2.5.1") {
		t.Errorf("other: %q", w.Other)
	}

	w, err = ParseWorkload(strings.NewReader("train: 200 launches in 1.00 s: 199.8 launches/s\n"))
	if err != nil || !w.Throughput || w.Launches != 200 || w.Rate != 199.8 || w.Latency {
		t.Errorf("throughput: %+v, %v", w, err)
	}
	w, err = ParseWorkload(strings.NewReader("infer: 0 requests in 2.00 s\n"))
	if err != nil || !w.Latency || w.Requests != 0 {
		t.Errorf("no requests: %+v, %v", w, err)
	}
	if _, err := ParseWorkload(strings.NewReader("calls: launches~3\n")); err == nil {
		t.Error("accepted a malformed calls: line")
	}
}

// TestWriteProbeCost checks the cost per launch from two rates.
func TestWriteProbeCost(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, "capture-cuda")
	WriteProbeCost(w, Workload{Throughput: true, Launches: 100000, Rate: 250000}, Workload{Throughput: true, Launches: 100000, Rate: 200000})
	res := mustParse(t, buf.String())
	s := res.Section("capture-cuda")
	if v, _ := s.Value("probe_cost_ns"); v.Num != 1000 {
		t.Errorf("probe cost %+v, want 1000 ns (5000 - 4000)", v)
	}
	if c, _ := s.Check("probe_cost"); c.Status != Info || !strings.Contains(c.Seen, "4000 ns each without probes, 5000 ns traced (+1000 ns, +25%)") {
		t.Errorf("check: %+v", c)
	}
	buf.Reset()
	WriteProbeCost(NewWriter(&buf, "x"), Workload{Other: []string{"capture: no GPU"}}, Workload{Throughput: true, Rate: 1})
	if c, _ := mustParse(t, buf.String()).Section("x").Check("probe_cost"); c.Status != Fail || !strings.Contains(c.Seen, "capture: no GPU") {
		t.Errorf("without a rate: %+v", c)
	}
}

// mustParse parses results text that must be well formed.
func mustParse(t *testing.T, s string) *Results {
	t.Helper()
	res, err := Parse(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Malformed) > 0 {
		t.Fatalf("malformed lines:\n%s\nin:\n%s", strings.Join(res.Malformed, "\n"), s)
	}
	return res
}
