package uprobe

import (
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/trace"
)

// drain reads events until the tracer closes; it returns a wait function.
func drain(tr *Tracer) func() {
	var wg sync.WaitGroup
	wg.Go(func() {
		var ev trace.Event
		for tr.Read(&ev) == nil {
		}
	})
	return wg.Wait
}

// tracing opens a tracer of pid alone, its options changed by set, and
// drains its events; stop closes it and waits for the reader.
func tracing(b *testing.B, r *rig, pid uint32, set func(*Options)) (tr *Tracer, stop func()) {
	o := r.options()
	o.PIDs = []uint32{pid}
	set(o)
	tr, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	wait := drain(tr)
	return tr, func() {
		if err := tr.Close(); err != nil {
			b.Fatal(err)
		}
		wait()
	}
}

// BenchmarkProbeCost measures, in one serving process and one run, the
// per-call time of cuLaunchKernel and cuStreamSynchronize (an idle stream)
// under each probe configuration:
//
//	unprobed       no probes
//	noop           the empty program at the chosen attach point (+4 after
//	               endbr64): the bare trap cost of that site
//	probe          the real programs there, reader draining the ring
//	probe-entry    the real programs at the function entry (endbr64, which
//	               the kernel single-steps)
//	noop+ret       the empty program on entry and return (syncs)
//	probe-wake     the real programs waking the reader on every record
//	               instead of past the fill threshold
//
// and reports probe/noop (budget ≤ 1.1; both net of the unprobed time),
// the speed-up of the emulated attach point over the entry, the
// uretprobe's cost (noop+ret − noop on cuStreamSynchronize), the sync
// probes against empty programs at the same entry and return sites, and
// what waking the reader per record would cost. Then, with the kernel's
// BPF run-time stats on, the programs' own run time net of the empty
// program's: launch-prog-ns, sync-progs-ns (entry and return) and that
// over the empty pair's cost, sync-progs/noop+ret, the part of the sync
// ratio above 1 with the trap's cost, which moves between runs far more
// than the programs' work, left out.
func BenchmarkProbeCost(b *testing.B) {
	r := newRig(b)
	p := r.start(b, nil, false, "serve")
	if l := p.line(b); l != "ready" {
		b.Fatalf("exerciser said %q", l)
	}
	// Each figure is the fastest of many short samples: on a shared
	// machine, other work only ever adds time, so the minimum estimates the
	// cost itself best.
	const n, reps = 1000, 9
	measure := func(cmd string) float64 {
		v := make([]float64, reps)
		for i := range v {
			p.send(b, cmd+" "+strconv.Itoa(n))
			f, err := strconv.ParseFloat(p.line(b), 64)
			if err != nil {
				b.Fatal(err)
			}
			v[i] = f
		}
		return slices.Min(v)
	}
	with := func(mode probeMode, wakeEvery bool) (launch, syncNs float64) {
		tr, stop := tracing(b, r, p.pid, func(o *Options) {
			o.mode = mode
			if wakeEvery {
				o.WakeupBytes = -1
			}
		})
		launch, syncNs = measure("launch"), measure("sync")
		if s := tr.Stats(); s.Drops != 0 || s.DecodeErrors != 0 {
			b.Errorf("mode %d: %d drops, %d decode errors", mode, s.Drops, s.DecodeErrors)
		}
		stop()
		return launch, syncNs
	}
	// Configurations are measured in five interleaved rounds, so that load from
	// other work on the machine hits all alike, and each takes its best.
	const rounds = 5
	type config struct {
		mode              probeMode
		probed, wakeEvery bool
		launch, syncs     []float64
	}
	configs := []*config{{probed: false}, {mode: probeNoop, probed: true}, {mode: probeFull, probed: true},
		{mode: probeEntryOffset, probed: true}, {mode: probeNoopReturn, probed: true},
		{mode: probeFull, probed: true, wakeEvery: true}}
	b.ResetTimer()
	for range rounds {
		for _, c := range configs {
			var l, s float64
			if c.probed {
				l, s = with(c.mode, c.wakeEvery)
			} else {
				l, s = measure("launch"), measure("sync")
			}
			c.launch, c.syncs = append(c.launch, l), append(c.syncs, s)
		}
	}
	b.StopTimer()
	baseL, baseS := slices.Min(configs[0].launch), slices.Min(configs[0].syncs)
	noopL, noopS := slices.Min(configs[1].launch), slices.Min(configs[1].syncs)
	probeL, probeS := slices.Min(configs[2].launch), slices.Min(configs[2].syncs)
	entryL := slices.Min(configs[3].launch)
	retS := slices.Min(configs[4].syncs)
	wakeL := slices.Min(configs[5].launch)

	b.ReportMetric(baseL, "unprobed-ns/call")
	b.ReportMetric(noopL, "noop-ns/call")
	b.ReportMetric(probeL, "probe-ns/call")
	b.ReportMetric(entryL, "probe-entry-ns/call")
	b.ReportMetric((probeL-baseL)/(noopL-baseL), "probe/noop")
	b.ReportMetric((entryL-baseL)/(probeL-baseL), "entry/emulated")
	b.ReportMetric(retS-noopS, "uretprobe-ns")
	b.ReportMetric((probeS-baseS)/(retS-baseS), "sync-probe/noop+ret")
	b.ReportMetric((wakeL-baseL)/(probeL-baseL), "wake-every/threshold")
	b.Logf("launch ns/call: unprobed %.0f, noop %.0f, probe %.0f, probe at entry %.0f, probe waking the reader per record %.0f",
		baseL, noopL, probeL, entryL, wakeL)
	b.Logf("sync ns/call: unprobed %.0f, noop %.0f, noop+ret %.0f, probe+ret %.0f", baseS, noopS, retS, probeS)

	// The programs' own run time, as the kernel counts it with BPF stats
	// on (two clock reads around every run, which the empty program's
	// time takes out): free of the trap's cost, which moves far more
	// between runs on a shared machine than the programs' own work.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF run-time stats: %v", err)
	}
	defer stats.Close()
	// runNs is the mean run time of each program while cmd ran.
	runNs := func(cmd string, progs ...*ebpf.Program) []float64 {
		before := make([]*ebpf.ProgramStats, len(progs))
		for i, pr := range progs {
			if before[i], err = pr.Stats(); err != nil {
				b.Fatal(err)
			}
		}
		measure(cmd)
		ns := make([]float64, len(progs))
		for i, pr := range progs {
			after, err := pr.Stats()
			if err != nil {
				b.Fatal(err)
			}
			if after.RunCount == before[i].RunCount {
				b.Fatalf("%s: program %d did not run", cmd, i)
			}
			ns[i] = float64(after.Runtime-before[i].Runtime) / float64(after.RunCount-before[i].RunCount)
		}
		return ns
	}
	var noopRun, launchRun, entryRun, returnRun []float64
	for range rounds {
		for _, mode := range []probeMode{probeNoop, probeFull} {
			tr, stop := tracing(b, r, p.pid, func(o *Options) { o.mode = mode })
			if mode == probeNoop {
				noopRun = append(noopRun, runNs("launch", tr.objs.progs.noop)[0])
			} else {
				launchRun = append(launchRun, runNs("launch", tr.objs.progs.launch)[0])
				ns := runNs("sync", tr.objs.progs.sync, tr.objs.progs.retSync)
				entryRun, returnRun = append(entryRun, ns[0]), append(returnRun, ns[1])
			}
			stop()
		}
	}
	noopNs := slices.Min(noopRun)
	launchOwn := slices.Min(launchRun) - noopNs
	syncOwn := slices.Min(entryRun) + slices.Min(returnRun) - 2*noopNs
	b.ReportMetric(launchOwn, "launch-prog-ns")
	b.ReportMetric(syncOwn, "sync-progs-ns")
	b.ReportMetric(syncOwn/(retS-baseS), "sync-progs/noop+ret")
	b.Logf("program run time (BPF stats), ns/run: empty %.0f, launch %.0f, sync entry %.0f, sync return %.0f",
		noopNs, slices.Min(launchRun), slices.Min(entryRun), slices.Min(returnRun))
}

// BenchmarkEventPipeline drives the real probes as hard as this machine
// can (one exerciser per CPU making calls through every variant) with the
// reader decoding, and reports the sustained events/s and the drops, which
// must be zero while the reader keeps up.
func BenchmarkEventPipeline(b *testing.B) {
	r := newRig(b)
	o := r.options()
	tr, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	procs := 2
	calls := max(b.N/procs, 10_000)
	var ps []*proc
	pids := map[uint32]bool{}
	for range procs {
		p := r.start(b, nil, true, "calls", strconv.Itoa(calls))
		ps = append(ps, p)
		pids[p.pid] = true
	}
	var got, exits int
	var first, last uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ev trace.Event
		for tr.Read(&ev) == nil {
			if !pids[ev.PID] {
				continue
			}
			switch ev.Kind {
			case trace.KindExit:
				if exits++; exits == procs {
					return
				}
				continue
			case trace.KindExec:
				continue
			}
			if first == 0 {
				first = ev.Time
			}
			last = ev.Time
			got++
		}
	}()
	b.ResetTimer()
	start := time.Now()
	for _, p := range ps {
		p.send(b, "go")
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatal("events did not arrive")
	}
	wall := time.Since(start)
	b.StopTimer()
	for _, p := range ps {
		p.wait(b)
	}
	s := tr.Stats()
	if got != procs*calls || s.Drops != 0 {
		b.Errorf("%d events of %d calls, %d drops", got, procs*calls, s.Drops)
	}
	b.ReportMetric(float64(got)/wall.Seconds(), "events/s")
	b.ReportMetric(float64(got)/(float64(last-first)/1e9), "producer-events/s")
	b.ReportMetric(float64(s.Drops), "drops")
}

// BenchmarkDecode is the reader's per-record cost alone.
func BenchmarkDecode(b *testing.B) {
	raw := make([][]byte, 0, len(trace.Funcs()))
	for i := range uint64(len(trace.Funcs())) {
		ev := expectCall(i, 1)
		rec := make([]byte, RecordSize)
		rec[offKind] = uint8(ev.Kind)
		rec[offFunc] = uint8(ev.Func)
		raw = append(raw, rec)
	}
	var ev trace.Event
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := Decode(raw[i%len(raw)], &ev); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkReaderDrain measures the Go side alone, end to end: a workload
// fills the ring while nobody reads, then Read drains it (ring buffer,
// decode, batch hand-off) as fast as it can. The kernel producer cannot
// reach this rate on this machine, so it is measured on a pre-filled ring.
func BenchmarkReaderDrain(b *testing.B) {
	r := newRig(b)
	calls := 140_000 // fits the 16 MiB ring with the reader's queue
	p := r.start(b, nil, true, "calls", strconv.Itoa(calls))
	o := r.options()
	o.PIDs = []uint32{p.pid}
	tr, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	p.send(b, "go")
	p.wait(b)
	want := calls + 1 // and the exit
	var ev trace.Event
	// The timer keeps running through the fill so that the harness runs
	// this once (the drain alone is far below -benchtime).
	start := time.Now()
	for i := 0; i < want; i++ {
		if err := tr.Read(&ev); err != nil {
			b.Fatal(err)
		}
	}
	wall := time.Since(start)
	if s := tr.Stats(); s.Drops != 0 || ev.Kind != trace.KindExit {
		b.Errorf("%d drops; last event %v", s.Drops, ev.Kind)
	}
	b.ReportMetric(float64(want)/wall.Seconds(), "events/s")
	b.ReportMetric(float64(tr.Stats().Drops), "drops")
}
