package whatif

import (
	"runtime"
	"sync"
	"time"
)

// Progress is where a comparison stands.
type Progress struct {
	// Baselines counts the baselines in all, Done those finished.
	Baselines, Done int
	// Running lists the baselines with a simulation under way, in report
	// order (exclusive once, however many of its solo runs are going).
	Running []Running
	// Simulated is the virtual time simulated so far over every run, Total
	// the virtual time of every run together (ns); their ratio is the
	// share of the work done.
	Simulated, Total uint64
	// Runs is each simulation of the comparison (a baseline, or one of
	// the exclusive baseline's solo runs), in a fixed order: runs differ
	// in their cost per simulated second (a closed loop reading every
	// event costs more), so an estimate of the time left needs each
	// one's own pace.
	Runs []RunProgress
}

// RunProgress is one simulation of a comparison.
type RunProgress struct {
	// Baseline names its baseline.
	Baseline string
	// Simulated is the virtual time it has simulated, Total all it will
	// (ns).
	Simulated, Total uint64
	// Started and Done say whether it has begun and ended.
	Started, Done bool
}

// Running is one baseline under way.
type Running struct {
	Baseline string
	// Fraction is the share of its simulated time done (0–1).
	Fraction float64
}

// lockstep is how far, in simulated time, a run may get ahead of the
// slowest run going: runs that keep together serve the same requests at
// about the same time, and share their service times (workload.Draws).
// A run is held back only while as many runs as there are threads are
// further behind it, to go on: where one run costs more per simulated
// second than the rest (the one that draws what the others read),
// holding all the others would leave threads idle; instead the runs
// closest behind it go on, and sharing does not need them close
// (workload.Draws keeps what a run far behind needs).
const lockstep = uint64(time.Second)

// tracker gathers the runs' progress, reports it one call at a time, and
// keeps the runs within lockstep of each other while that leaves no
// thread idle.
type tracker struct {
	report func(Progress)
	bases  []baseline
	jobs   []*job
	end    uint64
	procs  int // threads the runs have

	mu      sync.Mutex
	moved   *sync.Cond // a run progressed, finished, or the comparison stopped
	stopped bool
	now     []uint64 // virtual time reached, per job
	state   []uint8  // per job: 0 waiting, 1 running, 2 done
	held    int      // runs held back
}

func newTracker(cfg *Config, bases []baseline, jobs []*job, parallel int) *tracker {
	t := &tracker{report: cfg.Progress, bases: bases, jobs: jobs, end: uint64(cfg.Duration),
		procs: min(runtime.GOMAXPROCS(0), parallel),
		now:   make([]uint64, len(jobs)), state: make([]uint8, len(jobs))}
	t.moved = sync.NewCond(&t.mu)
	return t
}

// stop releases every run held back, for good (the comparison ends).
func (t *tracker) stop() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
	t.moved.Broadcast()
}

// forJob returns the progress callback of job i: it records the run's
// progress, reports it, and holds the run while it is ahead.
func (t *tracker) forJob(i int) func(now uint64) {
	t.mu.Lock()
	t.state[i] = 1
	t.mu.Unlock()
	return func(now uint64) {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.now[i] = min(now, t.end)
		if t.report != nil {
			t.report(t.snapshot())
		}
		t.moved.Broadcast()
		for !t.stopped && t.now[i] > t.slowest()+lockstep && t.behind(i) >= t.procs {
			t.held++
			t.moved.Wait()
			t.held--
		}
	}
}

// behind counts the runs going that are further behind than run i (at
// the same time: that started before it); the caller holds mu.
func (t *tracker) behind(i int) int {
	n := 0
	for j, st := range t.state {
		if st == 1 && (t.now[j] < t.now[i] || t.now[j] == t.now[i] && j < i) {
			n++
		}
	}
	return n
}

// slowest is the virtual time of the slowest run going; the caller holds
// mu.
func (t *tracker) slowest() uint64 {
	low := t.end
	for j, st := range t.state {
		if st == 1 {
			low = min(low, t.now[j])
		}
	}
	return low
}

// finish records that job i ended (successfully or not).
func (t *tracker) finish(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.state[i], t.now[i] = 2, t.end
	if t.report != nil {
		t.report(t.snapshot())
	}
	t.moved.Broadcast()
}

// snapshot builds the Progress; the caller holds mu.
func (t *tracker) snapshot() Progress {
	p := Progress{Baselines: len(t.bases), Total: t.end * uint64(len(t.jobs))}
	type agg struct {
		now, total  uint64
		running     bool
		done, count int
	}
	per := make([]agg, len(t.bases))
	p.Runs = make([]RunProgress, len(t.jobs))
	for i, j := range t.jobs {
		p.Runs[i] = RunProgress{Baseline: t.bases[j.base].name, Simulated: t.now[i], Total: t.end, Started: t.state[i] != 0, Done: t.state[i] == 2}
		a := &per[j.base]
		a.now += t.now[i]
		a.total += t.end
		a.count++
		switch t.state[i] {
		case 1:
			a.running = true
		case 2:
			a.done++
		}
		p.Simulated += t.now[i]
	}
	for i, a := range per {
		if a.done == a.count {
			p.Done++
			continue
		}
		if a.running {
			p.Running = append(p.Running, Running{Baseline: t.bases[i].name, Fraction: float64(a.now) / float64(max(a.total, 1))})
		}
	}
	return p
}
