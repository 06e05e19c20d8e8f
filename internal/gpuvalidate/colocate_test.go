package gpuvalidate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestColocate reads a co-location directory as the script writes it and
// checks each scenario against the workloads alone.
func TestColocate(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"01-lc-alone.what":      "LC alone\n",
		"01-lc-alone.lc.txt":    "infer: 3000 requests in 15.00 s: p50 400 us, p99 800 us, max 900 us\n",
		"02-be-alone.what":      "BE alone\n",
		"02-be-alone.be.txt":    "train: 1500 launches in 15.00 s: 100.0 launches/s\n",
		"03-default.lc.txt":     "ready\ninfer: 3000 requests in 15.00 s: p50 2400 us, p99 9600 us, max 12000 us\n",
		"03-default.be.txt":     "ready\ntrain: 1200 launches in 15.00 s: 80.0 launches/s\n",
		"04-timeslice.what":     "BE timeslice 100 µs, LC 10000 µs\n",
		"04-timeslice.lc.txt":   "infer: 3000 requests in 15.00 s: p50 450 us, p99 880 us, max 990 us\n",
		"04-timeslice.be.txt":   "colocate: cudaStreamCreate: out of memory\n",
		"04-timeslice.steps":    "@@ timeslice.be 1 2 0 arbiter channels timeslice 9 100\nprocess 9 ...\n@@ timeslice.lc 2 3 1 arbiter channels timeslice 8 10000\narbiter: process 8 exited\n",
		"05-interleave.skip":    "the stub driver has no channel groups to control\n",
		"05-interleave.what":    "BE interleave low, LC high\n",
		"10-suspend-be.lc.txt":  "infer: 3000 requests in 15.00 s: p50 400 us, p99 810 us, max 900 us\n",
		"10-suspend-be.be.txt":  "train: 30 launches in 16.00 s: 1.9 launches/s\n",
		"10-suspend-be.steps":   "@@ suspend.be 1 16000 0 arbiter channels suspend 9 --for 16s\nprocess 9 suspended in 700µs\n",
		"unrelated-file-no-dot": "",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sc, err := LoadScenarios(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range sc {
		names = append(names, s.Name)
	}
	if want := "[lc-alone be-alone default timeslice interleave suspend-be]"; fmt.Sprint(names) != want {
		t.Fatalf("scenarios %v, want %s", names, want)
	}
	var buf bytes.Buffer
	WriteColocate(NewWriter(&buf, "colocate"), sc)
	s := mustParse(t, buf.String()).Section("colocate")
	wantChecks(t, s, map[string][2]string{
		"scenario.lc-alone":   {"INFO", "LC alone; LC 3000 requests: p50 400 µs, p99 800 µs"},
		"scenario.be-alone":   {"INFO", "BE alone; BE 100.0 launches/s"},
		"scenario.default":    {"INFO", "LC 3000 requests: p50 2400 µs, p99 9600 µs (12.00× alone); BE 80.0 launches/s (80% of alone)"},
		"scenario.timeslice":  {"FAIL", "arbiter channels timeslice 8 10000 exit 1: arbiter: process 8 exited; BE printed no throughput (colocate: cudaStreamCreate: out of memory)"},
		"scenario.interleave": {"SKIP", "the stub driver has no channel groups to control"},
		"scenario.suspend-be": {"INFO", "LC 3000 requests: p50 400 µs, p99 810 µs (1.01× alone); BE 1.9 launches/s (2% of alone)"},
	})
	if _, ok := s.Check("scenarios"); ok {
		t.Error("scenarios passed although one failed")
	}
	for name, want := range map[string]float64{"default.lc.p99": 9600, "default.lc.p99_vs_alone": 12, "default.be.vs_alone": 0.8, "suspend-be.be.rate": 1.9} {
		if v, ok := s.Value(name); !ok || v.Num != want {
			t.Errorf("%s = %+v, want %v", name, v, want)
		}
	}
	if _, err := LoadScenarios(filepath.Join(dir, "absent")); err == nil {
		t.Error("read a directory that does not exist")
	}
}

// TestColocateWindow takes a best-effort training loop's rate over the
// latency-critical run's own window, not over its whole run.
func TestColocateWindow(t *testing.T) {
	dir := t.TempDir()
	const s0 = int64(1_764_000_000_000_000_000)
	sec := func(x float64) int64 { return s0 + int64(x*1e9) }
	// 10 steps/s before the LC runs, 4 steps/s while it does.
	progress := fmt.Sprintf("ready\nprogress %d 0\nprogress %d 20\nprogress %d 60\nprogress %d 80\ntrain: 80 steps in 8.00 s: 10.0 steps/s\n",
		sec(0), sec(2), sec(12), sec(14))
	files := map[string]string{
		"01-lc-alone.lc.txt":  "window 1 2\ninfer: 1000 requests in 10.00 s: p50 300 us, p99 500 us, max 900 us\n",
		"02-be-alone.be.txt":  "train: 100 steps in 10.00 s: 10.0 steps/s\n",
		"03-observe.lc.txt":   fmt.Sprintf("window %d %d\ninfer: 1000 requests in 10.00 s: p50 900 us, p99 2000 us, max 3000 us\n", sec(2), sec(12)),
		"03-observe.be.txt":   progress,
		"04-short.lc.txt":     fmt.Sprintf("window %d %d\ninfer: 10 requests in 1.00 s\n", sec(1), sec(20)),
		"04-short.be.txt":     progress,
		"04-short.what":       "the BE ended before the LC",
		"05-backwards.be.txt": "progress 5 3\nprogress 4 3\n",
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, text := range files {
		if name[:2] != "04" && name[:2] != "05" {
			write(name, text)
		}
	}
	sc, err := LoadScenarios(dir)
	if err != nil {
		t.Fatal(err)
	}
	be := sc[2].BE
	if be == nil || !be.Throughput || be.Rate != 4 || be.Unit != "steps" || be.Seconds != 10 {
		t.Fatalf("observe BE = %+v, want 4 steps/s over the LC's 10 s", be)
	}
	var buf bytes.Buffer
	WriteColocate(NewWriter(&buf, "daemon"), sc)
	wantChecks(t, mustParse(t, buf.String()).Section("daemon"), map[string][2]string{
		"scenario.observe": {"INFO", "LC 1000 requests: p50 900 µs, p99 2000 µs (4.00× alone); BE 4.0 steps/s (40% of alone)"},
	})
	write("04-short.lc.txt", files["04-short.lc.txt"])
	write("04-short.be.txt", files["04-short.be.txt"])
	if _, err := LoadScenarios(dir); err == nil || !strings.Contains(err.Error(), "does not cover") {
		t.Errorf("a BE that ended before the LC's window: err %v", err)
	}
	os.Remove(filepath.Join(dir, "04-short.lc.txt"))
	os.Remove(filepath.Join(dir, "04-short.be.txt"))
	write("05-backwards.be.txt", files["05-backwards.be.txt"])
	if _, err := LoadScenarios(dir); err == nil || !strings.Contains(err.Error(), "backwards") {
		t.Errorf("progress going backwards: err %v", err)
	}
}
