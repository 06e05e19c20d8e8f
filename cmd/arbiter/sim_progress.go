package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/sim/whatif"
)

// progress prints, at most once a second of wall time, how many
// baselines are done of how many, the share of all runs done, an estimate
// of the time left, and which baselines are running and how far. On a
// terminal of known width each report replaces the last on one line, cut
// to fit (a line that wrapped could not be replaced; the list of runs
// comes last, so that the cut takes it first), and done ends it;
// elsewhere, a log file, each is a line of its own.
//
// The estimate is the longest of the runs' own: each run's time left at
// its own pace (see timeLeft). A comparison's runs differ in cost per
// simulated second by multiples (the arbiter baseline runs the policy
// and the engine on every event), so the share of all simulated time
// done alone would promise the end long before the slowest run gets
// there.
type progress struct {
	w     io.Writer
	clock func() time.Time
	start time.Time
	last  time.Time
	width int  // the terminal's columns; 0: a line each report
	shown bool // a report is on the line (width > 0)

	// Per run of the comparison: virtual time at the last report, and
	// recent pace (virtual ns per wall ns, smoothed; 0 until measured).
	seen   []uint64
	recent []float64
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
	since := t.Sub(p.last)
	p.last = t
	line := fmt.Sprintf("sim: %d/%d baselines done", s.Done, s.Baselines)
	if s.Total > 0 && s.Simulated > 0 {
		frac := float64(s.Simulated) / float64(s.Total)
		eta := p.timeLeft(s, t.Sub(p.start), since, frac).Round(time.Second)
		left := fmt.Sprintf("about %v left", eta)
		if eta == 0 {
			left = "under a second left"
		}
		line += fmt.Sprintf(", %.0f%% of all runs, %s", 100*frac, left)
	}
	var run []string
	for _, r := range s.Running {
		run = append(run, fmt.Sprintf("%s %.0f%%", r.Baseline, 100*r.Fraction))
	}
	if len(run) > 0 {
		line += "; running " + strings.Join(run, ", ")
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

// timeLeft estimates the wall time left: the longest of the running
// runs' times left at their own pace, and no less than the share of all
// simulated time left at the pace of all so far (which also stands for
// the runs not started yet). elapsed is the wall time since the start,
// since that since the report before, frac the share done. A run's pace
// is the faster of its recent one (since the report before, smoothed:
// a run speeds up as others end and leave it a thread) and its average
// since the start (a run held back for the others to catch up makes no
// progress for a while, and is not slow for it).
func (p *progress) timeLeft(s whatif.Progress, elapsed, since time.Duration, frac float64) time.Duration {
	left := float64(elapsed) * (1 - frac) / frac
	if len(p.recent) != len(s.Runs) {
		p.seen, p.recent = make([]uint64, len(s.Runs)), make([]float64, len(s.Runs))
	}
	for i, r := range s.Runs {
		moved := r.Simulated - min(p.seen[i], r.Simulated)
		p.seen[i] = r.Simulated
		if !r.Started || r.Done || since <= 0 || elapsed <= 0 {
			continue
		}
		recent := float64(moved) / float64(since)
		if p.recent[i] > 0 {
			recent = (p.recent[i] + recent) / 2
		}
		p.recent[i] = recent
		pace := max(recent, float64(r.Simulated)/float64(elapsed))
		rest := float64(r.Total - min(r.Simulated, r.Total))
		switch {
		case rest == 0:
		case pace > 0:
			left = max(left, rest/pace)
		default:
			// Nothing simulated yet: at least as long again as the
			// comparison has run.
			left = max(left, float64(elapsed))
		}
	}
	return time.Duration(left)
}
