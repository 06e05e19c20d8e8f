package workload

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/trace"
)

// maxReplayOps bounds the operations kept from one replayed trace.
const maxReplayOps = 1 << 24

// minInferred is the shortest kernel duration replay infers: a batch whose
// synchronization returned sooner than its copies allow gets this.
const minInferred = uint64(time.Microsecond)

// copyModel is how the simulator times copies, used to subtract copy time
// when inferring kernel durations.
type copyModel struct{ opts sim.Options }

func copyModelOf(o *sim.Options) copyModel {
	r, err := o.WithDefaults()
	if err != nil {
		r, _ = (&sim.Options{}).WithDefaults()
	}
	return copyModel{opts: r}
}

func (c copyModel) duration(n uint64) uint64 { return c.opts.CopyDuration(n) }

// call is one recorded driver call of a replayed process.
type call struct {
	kind  sim.OpKind // OpKernel, OpCopy, OpSync
	t     uint64     // entry time
	end   uint64     // return time (syncs), else t
	bytes uint64
	dir   trace.CopyDir
	dur   uint64 // inferred kernel or modelled copy duration
}

// traceHolds says which processes the trace in fh made driver calls
// from, for an error about one it does not hold: "; it holds ...".
func traceHolds(fh *os.File) string {
	if _, err := fh.Seek(0, io.SeekStart); err != nil {
		return ""
	}
	procs, err := TraceProcesses(fh)
	if err != nil {
		return ""
	}
	if len(procs) == 0 {
		return "; it holds no driver calls at all"
	}
	const most = 8
	var names []string
	for _, p := range procs[:min(len(procs), most)] {
		n := fmt.Sprintf("pid %d", p.PID)
		if p.Comm != "" {
			n = fmt.Sprintf("comm %s (pid %d)", p.Comm, p.PID)
		}
		names = append(names, fmt.Sprintf("%s, %d calls", n, p.Calls))
	}
	if len(procs) > most {
		names = append(names, fmt.Sprintf("and %d more", len(procs)-most))
	}
	return "; it holds those of " + strings.Join(names, "; ")
}

// replay builds the workloads of Spec.Replay[i].
func (f *File) replay(i int, cm copyModel) ([]Workload, error) {
	r := &f.Spec.Replay[i]
	path := fmt.Sprintf("replay[%d]", i)
	name := r.File
	if !filepath.IsAbs(name) {
		name = filepath.Join(f.Dir, name)
	}
	fh, err := os.Open(name)
	if err != nil {
		return nil, &FieldError{File: f.Path, Path: path + ".file", Msg: err.Error()}
	}
	defer fh.Close()
	rec, err := ReadRecording(fh, r.Processes)
	if err != nil {
		return nil, fmt.Errorf("%s (%s.file): %w", name, path, err)
	}
	var out []Workload
	for j, rp := range r.Processes {
		calls := rec.Calls[j]
		if len(calls) == 0 {
			return nil, &FieldError{File: f.Path, Path: fmt.Sprintf("%s.processes[%d]", path, j),
				Msg: fmt.Sprintf("no driver calls of this process in %s%s", name, traceHolds(fh))}
		}
		if err := inferDurations(calls, cm); err != nil {
			return nil, &FieldError{File: f.Path, Path: fmt.Sprintf("%s.processes[%d]", path, j), Msg: err.Error()}
		}
		gap := uint64(rp.RequestGap)
		if gap == 0 {
			gap = uint64(trace.DefaultIdleGap)
		}
		class := sim.ClassBE
		if rp.Class == "lc" {
			class = sim.ClassLC
		}
		ops := replayOps(calls, rec.Start, class == sim.ClassLC, gap, rp.RequestEnd == "sync")
		out = append(out, Workload{
			Name: rp.Name, Group: rp.Name, Class: class, GPU: rp.GPU, SLO: rp.SLO, Source: "replay:" + r.File, Labels: rp.Labels, Env: rp.Env,
			newProgram: func(_, _ uint64, _ *dispatcher, _ *Draws) sim.Program {
				return &replayProgram{ops: ops, lc: class == sim.ClassLC}
			},
		})
	}
	return out, nil
}

// Recording is the part of a trace that replay uses.
type Recording struct {
	// Start is the earliest event time in the file (the replay's time 0).
	Start uint64
	// Calls holds, per selected process, its launches, copies and
	// blocking synchronizations in order.
	Calls [][]call
}

// ReadRecording reads a trace file and keeps the calls of the selected
// processes: by pid, or by comm, the name in their exec event or, for a
// process already running when the recording started (no exec event: the
// common case of attaching to a live server), in the name record the
// recorder wrote for it. A corrupt or truncated file is an error carrying
// the byte offset (*trace.FormatError).
func ReadRecording(r io.Reader, sel []ReplayProcess) (*Recording, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, err
	}
	rec := &Recording{Calls: make([][]call, len(sel))}
	byPID := map[uint32]int{}
	for i, s := range sel {
		if s.PID != 0 {
			byPID[s.PID] = i
		}
	}
	byComm := map[string]int{}
	for i, s := range sel {
		if s.Comm != "" {
			byComm[s.Comm] = i
		}
	}
	seen := map[uint32]bool{} // pids whose name was looked up
	first, n := true, 0
	var ev trace.Event
	for {
		err := tr.Read(&ev)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if first || ev.Time < rec.Start {
			rec.Start, first = ev.Time, false
		}
		if ev.Kind == trace.KindExec {
			seen[ev.PID] = true
			if i, ok := byComm[ev.Proc.CommString()]; ok {
				byPID[ev.PID] = i
			}
			continue
		}
		i, ok := byPID[ev.PID]
		if !ok {
			if seen[ev.PID] || len(byComm) == 0 {
				continue
			}
			seen[ev.PID] = true
			name, named := tr.Name(ev.PID)
			if i, ok = byComm[name]; !named || !ok {
				continue
			}
			byPID[ev.PID] = i
		}
		c := call{t: ev.Time, end: ev.Time}
		switch ev.Kind {
		case trace.KindLaunch:
			c.kind = sim.OpKernel
		case trace.KindCopy:
			c.kind, c.bytes, c.dir = sim.OpCopy, ev.Copy.Bytes, ev.Copy.Dir
		case trace.KindSync:
			if !blocking(ev.Func) {
				continue
			}
			c.kind, c.end = sim.OpSync, ev.Time+ev.Sync.Duration
		default:
			continue
		}
		if n++; n > maxReplayOps {
			return nil, fmt.Errorf("more than %d replayed calls", maxReplayOps)
		}
		rec.Calls[i] = append(rec.Calls[i], c)
		if c.kind == sim.OpCopy && !ev.Func.Info().Async {
			// A synchronous copy blocks its caller until it is done.
			rec.Calls[i] = append(rec.Calls[i], call{kind: sim.OpSync, t: ev.Time, end: ev.Time})
		}
	}
	return rec, nil
}

// blocking reports whether a synchronizing call makes the host wait for
// the GPU (cuStreamWaitEvent and cuEventRecord do not).
func blocking(f trace.Func) bool {
	switch f {
	case trace.FuncStreamSynchronize, trace.FuncStreamSynchronizePtsz, trace.FuncCtxSynchronize,
		trace.FuncCtxSynchronizeV2, trace.FuncEventSynchronize:
		return true
	}
	return false
}

// inferDurations fills in kernel durations from the recorded timings.
//
// The calls between two blocking synchronizations form a batch queued on
// the stream in order: call j entered at t_j, copies take their modelled
// time c_j, and the stream drained when the synchronization returned at E.
// With every kernel of the batch taking the same time d, the stream's
// FIFO completion time is max_j (t_j + C_j + K_j·d), where C_j and K_j are
// the copy time and kernel count from call j on. Setting it equal to E
// gives d = min over j with K_j > 0 of (E − t_j − C_j) / K_j: the longest
// kernel time consistent with both the launch times (the GPU may have run
// ahead of the host) and the synchronization's return. Kernels after the
// last synchronization take the mean of the inferred durations.
func inferDurations(calls []call, cm copyModel) error {
	var sum, nk uint64
	start := 0
	for i := range calls {
		c := &calls[i]
		if c.kind == sim.OpCopy {
			c.dur = cm.duration(c.bytes)
		}
		if c.kind != sim.OpSync {
			continue
		}
		d, k := batchDuration(calls[start:i], c.end)
		if k > 0 {
			sum += d * k
			nk += k
		}
		start = i + 1
	}
	var tail uint64
	for _, c := range calls[start:] {
		if c.kind == sim.OpKernel {
			tail++
		}
	}
	if tail > 0 {
		if nk == 0 {
			return errors.New("kernels but no blocking synchronization in the trace: kernel durations cannot be inferred")
		}
		for i := start; i < len(calls); i++ {
			if calls[i].kind == sim.OpKernel {
				calls[i].dur = sum / nk
			}
		}
	}
	return nil
}

// batchDuration infers and assigns the kernel duration of one batch; it
// returns it and the batch's kernel count.
func batchDuration(batch []call, end uint64) (uint64, uint64) {
	var copies, kernels uint64
	best := uint64(0)
	found := false
	for j := len(batch) - 1; j >= 0; j-- {
		switch batch[j].kind {
		case sim.OpCopy:
			copies += batch[j].dur
		case sim.OpKernel:
			kernels++
		}
		if kernels == 0 {
			continue
		}
		var d uint64
		if need := batch[j].t + copies; end > need {
			d = (end - need) / kernels
		}
		if !found || d < best {
			best, found = d, true
		}
	}
	if kernels == 0 {
		return 0, 0
	}
	best = max(best, minInferred)
	for j := range batch {
		if batch[j].kind == sim.OpKernel {
			batch[j].dur = best
		}
	}
	return best, kernels
}

// replayOps turns recorded calls into a host program: each call after the
// recorded host time since the previous call returned; for LC processes,
// calls after an idle gap of at least gap start a request that arrives at
// its recorded offset, and the last synchronization before the next gap
// ends it (with perSync, every blocking synchronization ends one and the
// next call starts the next).
func replayOps(calls []call, t0 uint64, lc bool, gap uint64, perSync bool) []sim.Op {
	var ops []sim.Op
	prevEnd := calls[0].t
	inReq := false
	for i, c := range calls {
		host := uint64(0)
		if c.t > prevEnd {
			host = c.t - prevEnd
		}
		newReq := i == 0 || host >= gap || (perSync && lc && calls[i-1].kind == sim.OpSync)
		if newReq {
			if inReq {
				ops = append(ops, sim.Op{Kind: sim.OpEnd})
				inReq = false
			}
			at := c.t - t0
			ops = append(ops, sim.Op{Kind: sim.OpWaitUntil, At: at})
			if lc {
				ops = append(ops, sim.Op{Kind: sim.OpBegin, At: at})
				inReq = true
			}
		} else if host > 0 {
			ops = append(ops, sim.Op{Kind: sim.OpSleep, Dur: host})
		}
		switch c.kind {
		case sim.OpKernel:
			ops = append(ops, sim.Op{Kind: sim.OpKernel, Dur: max(c.dur, 1)})
		case sim.OpCopy:
			ops = append(ops, sim.Op{Kind: sim.OpCopy, Bytes: c.bytes, Dir: c.dir})
		case sim.OpSync:
			if inReq && (perSync || endsRequest(calls, i, gap)) {
				ops = append(ops, sim.Op{Kind: sim.OpEnd})
				inReq = false
			} else {
				ops = append(ops, sim.Op{Kind: sim.OpSync})
			}
		}
		prevEnd = max(prevEnd, c.end)
	}
	if inReq {
		ops = append(ops, sim.Op{Kind: sim.OpEnd})
	}
	return append(ops, sim.Op{Kind: sim.OpStop})
}

// endsRequest reports whether sync i is the last call before an idle gap
// (or the end).
func endsRequest(calls []call, i int, gap uint64) bool {
	if i+1 == len(calls) {
		return true
	}
	return calls[i+1].t >= calls[i].end && calls[i+1].t-calls[i].end >= gap
}

// replayProgram plays a fixed list of operations.
type replayProgram struct {
	ops []sim.Op
	i   int
	lc  bool
}

// Next implements sim.Program.
func (p *replayProgram) Next(uint64) (sim.Op, error) {
	if p.i == len(p.ops) {
		return sim.Op{Kind: sim.OpStop}, nil
	}
	p.i++
	return p.ops[p.i-1], nil
}
