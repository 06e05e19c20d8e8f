package whatif

import (
	"context"
	"io/fs"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkSimulatorHour simulates one hour of the 2-GPU, 100k-request
// benchmark workload (examples/workloads/bench-2gpu-100k.yaml) per
// iteration, open loop (time-slicing) and closed loop (the scripted
// controller reading every event and suspending/resuming BE). Target: one
// simulated hour in ≤ 10 s, i.e. ≥ 360 simulated seconds per second.
func BenchmarkSimulatorHour(b *testing.B) {
	f := examples(b, "bench-2gpu-100k.yaml")
	for _, baseline := range []string{Timeslice, Priority, ScriptedSuspend} {
		b.Run(baseline, func(b *testing.B) {
			cfg := config(b, f, time.Hour, 1, baseline)
			var requests uint64
			start := time.Now()
			for b.Loop() {
				r, err := Run(context.Background(), cfg)
				if err != nil {
					b.Fatal(err)
				}
				requests = 0
				for _, l := range r.Baselines[0].LC {
					requests += l.Requests
				}
			}
			wall := time.Since(start).Seconds() / float64(b.N)
			b.ReportMetric(time.Hour.Seconds()/wall, "sim-s/wall-s")
			b.ReportMetric(wall, "wall-s/sim-hour")
			b.ReportMetric(float64(requests), "requests")
		})
	}
}

// BenchmarkExamplesHour simulates one hour of every shipped example under
// every baseline per iteration, as `arbiter sim --duration 1h` does
// (docs/benchmarks.md, "Simulator"): one-at-a-time runs the examples one
// after the other and reports the wall time of each and of all; together
// runs them all at once, each with its baselines, as one program
// simulating them all would, and reports the wall time of all.
func BenchmarkExamplesHour(b *testing.B) {
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..", "examples", "workloads")
	var specs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".yaml") {
			rel, _ := filepath.Rel(root, path)
			specs = append(specs, rel)
		}
		return err
	})
	if err != nil || len(specs) == 0 {
		b.Fatalf("no examples under %s: %v", root, err)
	}
	all := Names()[:len(Names())-1] // every baseline but arbiter
	cfgs := make(map[string]*Config)
	for _, name := range specs {
		cfgs[name] = config(b, examples(b, name), time.Hour, 1, all...)
	}
	run := func(b *testing.B, name string) {
		if _, err := Run(context.Background(), cfgs[name]); err != nil {
			b.Errorf("%s: %v", name, err)
		}
	}
	b.Run("one-at-a-time", func(b *testing.B) {
		walls := make(map[string]float64)
		for b.Loop() {
			for _, name := range specs {
				start := time.Now()
				run(b, name)
				walls[name] += time.Since(start).Seconds()
			}
		}
		var total float64
		for _, name := range specs {
			w := walls[name] / float64(b.N)
			total += w
			b.ReportMetric(w, "wall-s/"+strings.TrimSuffix(filepath.Base(name), ".yaml"))
		}
		b.ReportMetric(total, "wall-s/all")
	})
	b.Run("together", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			var wg sync.WaitGroup
			for _, name := range specs {
				wg.Go(func() { run(b, name) })
			}
			wg.Wait()
		}
		b.ReportMetric(time.Since(start).Seconds()/float64(b.N), "wall-s/all")
	})
}
