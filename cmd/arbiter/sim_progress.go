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
// estimate of the time left from the rate so far. On a terminal of known
// width each report replaces the last on one line, cut to fit (a line
// that wrapped could not be replaced), and done ends it; elsewhere, a log
// file, each is a line of its own.
type progress struct {
	w     io.Writer
	clock func() time.Time
	start time.Time
	last  time.Time
	width int  // the terminal's columns; 0: a line each report
	shown bool // a report is on the line (width > 0)
}

func newProgress(w io.Writer, clock func() time.Time, width int) *progress {
	now := clock()
	return &progress{w: w, clock: clock, start: now, last: now, width: width}
}

// done ends the line of an in-place report, so that what follows starts
// on a line of its own.
func (p *progress) done() {
	if p.shown {
		fmt.Fprintln(p.w)
		p.shown = false
	}
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
	if p.width > 0 {
		if r := []rune(line); len(r) > p.width-1 {
			line = string(r[:max(p.width-1, 0)])
		}
		// Back to the start of the line, the line cleared.
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.shown = true
		return
	}
	fmt.Fprintln(p.w, line)
}
