package whatif

import (
	"context"
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
