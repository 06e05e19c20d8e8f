package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/sim/whatif"
)

// progress prints, at most once a second of wall time, which baselines
// are running and how far, how many are done of how many, and an
// estimate of the time left from the rate so far.
type progress struct {
	w     io.Writer
	clock func() time.Time
	start time.Time
	last  time.Time
}

func newProgress(w io.Writer, clock func() time.Time) *progress {
	now := clock()
	return &progress{w: w, clock: clock, start: now, last: now}
}

func (p *progress) report(s whatif.Progress) {
	t := p.clock()
	if t.Sub(p.last) < time.Second {
		return
	}
	p.last = t
	var run []string
	for _, r := range s.Running {
		run = append(run, fmt.Sprintf("%s %.0f%%", r.Baseline, 100*r.Fraction))
	}
	line := fmt.Sprintf("sim: %d/%d baselines done", s.Done, s.Baselines)
	if len(run) > 0 {
		line += "; running " + strings.Join(run, ", ")
	}
	if s.Total > 0 && s.Simulated > 0 {
		frac := float64(s.Simulated) / float64(s.Total)
		elapsed := t.Sub(p.start)
		eta := time.Duration(float64(elapsed) * (1 - frac) / frac).Round(time.Second)
		left := fmt.Sprintf("about %v left", eta)
		if eta == 0 {
			left = "under a second left"
		}
		line += fmt.Sprintf("; %.0f%% of all runs, %s", 100*frac, left)
	}
	fmt.Fprintln(p.w, line)
}
