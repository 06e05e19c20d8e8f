package whatif

import (
	"context"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sim/report"
)

// published is one figure of a paper and the simulator's value for it,
// with the ratio sim/paper the test accepts.
type published struct {
	what        string
	paper, sim  float64
	lo, hi      float64
	explanation string
}

// checkPublished logs the comparison as the table docs/simulator.md shows
// and fails where a ratio leaves its tolerance.
func checkPublished(t *testing.T, pts []published) {
	t.Helper()
	t.Logf("| figure | paper | simulator | sim/paper | accepted |")
	for _, p := range pts {
		r := p.sim / p.paper
		t.Logf("| %s | %.2f | %.2f | %.2f | %.2f–%.2f |", p.what, p.paper, p.sim, r, p.lo, p.hi)
		if r < p.lo || r > p.hi {
			t.Errorf("%s: simulator %.3f, paper %.3f: ratio %.3f outside %.2f–%.2f (%s)", p.what, p.sim, p.paper, r, p.lo, p.hi, p.explanation)
		}
	}
}

func runPublished(t *testing.T, name string, baselines ...string) *report.Report {
	t.Helper()
	f := examples(t, "published/"+name)
	r, err := Run(context.Background(), config(t, f, time.Duration(f.Spec.Duration), 1, baselines...))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPublishedXSchedPriority rebuilds XSched's fixed-priority point on a
// GV100 (paper Figure 9, artifact fig7; sources in the spec): the
// foreground ResNet-152's latency alone, next to a background one under
// the driver's time-slicing, and under XSched's priority, which is the
// wait-based baseline. Tolerance ±15%: the simulator charges none of
// XSched's own runtime (its interception and progressive launching),
// which puts 0.4 ms on the foreground p50 and 0.9 ms on its p99 in the
// paper, so XSched's figures come out 6% and 11% lower.
func TestPublishedXSchedPriority(t *testing.T) {
	r := runPublished(t, "xsched-fig9-gv100-priority.yaml", Exclusive, Timeslice, PriorityWait)
	ms := func(b string, q func(l report.LC) uint64) float64 {
		return float64(q(lc(t, r, b, "resnet152-fg"))) / 1e6
	}
	p50 := func(l report.LC) uint64 { return l.P50NS }
	p99 := func(l report.LC) uint64 { return l.P99NS }
	const why = "XSched's runtime overhead is not modelled"
	checkPublished(t, []published{
		{"standalone p50 (ms)", 6.487, ms(Exclusive, p50), 0.85, 1.15, why},
		{"standalone p99 (ms)", 6.522, ms(Exclusive, p99), 0.85, 1.15, why},
		{"native (timeslice) p50 (ms)", 13.053, ms(Timeslice, p50), 0.85, 1.15, why},
		{"native (timeslice) p99 (ms)", 14.111, ms(Timeslice, p99), 0.85, 1.15, why},
		{"XSched (priority-wait) p50 (ms)", 6.904, ms(PriorityWait, p50), 0.85, 1.15, why},
		{"XSched (priority-wait) p99 (ms)", 7.396, ms(PriorityWait, p99), 0.85, 1.15, why},
	})
}

// TestPublishedXSchedCotrain rebuilds XSched's co-training point on a
// GV100 (paper Figure 13, artifact fig11; sources in the spec): two
// ShuffleNet training jobs, iterations per second alone, together under
// the driver's time-slicing, and under XSched's priority (the wait-based
// baseline) with the production job high. Tolerance ±15%, except the
// opportunistic job under XSched: the simulator's priority has no
// scheduler in the way (XSched resumes the low-priority queue through its
// server and keeps at most 64 of its commands in flight), so it gives the
// harvesting job an upper bound, accepted up to 1.45× the paper's.
func TestPublishedXSchedCotrain(t *testing.T) {
	r := runPublished(t, "xsched-fig13-gv100-cotrain.yaml", Exclusive, Timeslice, PriorityWait)
	secs := time.Duration(r.DurationNS).Seconds()
	prod := func(b string) float64 { return float64(lc(t, r, b, "production").Requests) / secs }
	// An opportunistic iteration is 300 kernels (the spec's sync_every).
	opp := func(b string) float64 {
		for _, x := range r.Baselines {
			if x.Name == b {
				return float64(x.BE[0].Kernels) / 300 / secs
			}
		}
		t.Fatalf("no baseline %s", b)
		return 0
	}
	const why = "XSched's scheduler overhead is not modelled"
	checkPublished(t, []published{
		{"standalone (iterations/s)", 46.82, prod(Exclusive), 0.85, 1.15, why},
		{"native production (iterations/s)", 29.65, prod(Timeslice), 0.85, 1.15, why},
		{"native opportunistic (iterations/s)", 29.23, opp(Timeslice), 0.85, 1.15, why},
		{"XSched production (iterations/s)", 47.50, prod(PriorityWait), 0.85, 1.15, why},
		{"XSched opportunistic (iterations/s)", 10.54, opp(PriorityWait), 1.0, 1.45, why},
	})
}
