package sim

import (
	"fmt"
	"io"

	"github.com/gpu-arbiter/arbiter/trace"
)

// streamHandle is the CUstream every simulated process uses.
const streamHandle = 0x5000

// Start fixes the end of the run (virtual ns) for Read. Run calls it
// itself; a consumer that drives the simulation only with Read calls Start
// first.
func (s *Simulator) Start(end uint64) { s.start(end) }

// Read advances the simulation to the next observable event (only with
// Options.Observe) and returns it: exec at time 0 for every process, then
// launches, copies and synchronizations (reported at their return, with
// their duration) as a live tracer would see them. It returns io.EOF when
// the end time is reached, ErrClosed after Close, trace.ErrDeadline when
// the read deadline comes first (the clock then reads the deadline), or the
// model's error.
func (s *Simulator) Read(ev *trace.Event) error {
	if err := s.fill(); err != nil {
		return err
	}
	*ev = s.out[s.outHead]
	if s.outN[s.outHead] > 1 {
		s.outN[s.outHead]--
	} else {
		s.outHead++
	}
	return nil
}

// ReadBatch is Read for a consumer that takes events in place: it returns,
// in order, every event left from the simulator's last step (or, if none
// is, from the next one), each standing for counts[i] identical events in
// a row (a burst's launches), as Read would return them one by one. It
// returns the same errors as Read, when Read would. The slices are the
// simulator's own: they hold until the next Read or ReadBatch, and the
// consumer must not change them. A read deadline set while they are
// handled applies from the next call, as it would between Reads.
func (s *Simulator) ReadBatch() (evs []trace.Event, counts []uint32, err error) {
	if err := s.fill(); err != nil {
		return nil, nil, err
	}
	evs, counts = s.out[s.outHead:], s.outN[s.outHead:]
	s.outHead = len(s.out)
	return evs, counts, nil
}

// fill steps the simulation until it has an event to deliver, or returns
// why there is none.
func (s *Simulator) fill() error {
	for s.outHead == len(s.out) {
		if !s.started {
			return fmt.Errorf("read: call Start or Run first")
		}
		if s.closed.Load() {
			return ErrClosed
		}
		if s.err != nil {
			return s.err
		}
		s.out, s.outN, s.outHead = s.out[:0], s.outN[:0], 0
		if s.deadline != 0 && s.nextTime() > s.deadline {
			if s.now < s.deadline {
				s.now = min(s.deadline, s.end)
			}
			return trace.ErrDeadline
		}
		if !s.step() {
			if s.err != nil {
				return s.err
			}
			return io.EOF
		}
		if s.steps++; s.steps&(progressEvery-1) == 0 && s.progress != nil {
			s.progress(s.now)
		}
	}
	return nil
}

// nextTime is the time of the next event, or just past the end.
func (s *Simulator) nextTime() uint64 {
	if s.q.len() == 0 || s.q.peek().t > s.end {
		return s.end + 1
	}
	return s.q.peek().t
}

// ReadProgress makes Read call progress(now) every 16,384 events it
// simulates, as RunProgress does, for a consumer that drives the
// simulation with Read.
func (s *Simulator) ReadProgress(progress func(now uint64)) { s.progress = progress }

// SetReadDeadline implements engine.DeadlineSource on virtual time.
func (s *Simulator) SetReadDeadline(t uint64) error {
	s.deadline = t
	return nil
}

// Close stops the simulation: a Run in progress returns ErrClosed soon, and
// Read returns ErrClosed. It is idempotent and safe from any goroutine.
func (s *Simulator) Close() error {
	s.closed.Store(true)
	return nil
}

// emit appends a zeroed event to the output, to be read n times, and
// returns it to be filled in place (a trace.Event is 216 bytes: building
// it elsewhere and copying it in costs more than the rest of delivering
// a launch, and a burst's launches, all alike, are built once).
func (s *Simulator) emit(n uint32) *trace.Event {
	s.outN = append(s.outN, n)
	if len(s.out) < cap(s.out) {
		s.out = s.out[:len(s.out)+1]
		ev := &s.out[len(s.out)-1]
		*ev = trace.Event{}
		return ev
	}
	s.out = append(s.out, trace.Event{})
	return &s.out[len(s.out)-1]
}

// emitLaunch reports n launches of p's at now: the kernels of a burst
// are launched at the same instant on the same stream. The emit
// functions test whether the run is observed and call on only if it is,
// which keeps them small enough to inline where it is not.
func (s *Simulator) emitLaunch(p *proc, now uint64, n uint32) {
	if s.cfg.observe {
		s.launchEvent(p, now, n)
	}
}

// launchEvent is emitLaunch's event.
func (s *Simulator) launchEvent(p *proc, now uint64, n uint32) {
	ev := s.emit(n)
	ev.Kind, ev.Func, ev.PID, ev.TID, ev.Time = trace.KindLaunch, trace.FuncLaunchKernel, p.pid, p.pid, now
	ev.Launch.Stream = streamHandle
}

// emitCopy reports p's copy op at now.
func (s *Simulator) emitCopy(p *proc, now uint64, op *Op) {
	if s.cfg.observe {
		s.copyEvent(p, now, op)
	}
}

// copyEvent is emitCopy's event.
func (s *Simulator) copyEvent(p *proc, now uint64, op *Op) {
	f := trace.FuncMemcpyHtoDAsyncV2
	if op.Dir == trace.CopyDtoH {
		f = trace.FuncMemcpyDtoHAsyncV2
	}
	ev := s.emit(1)
	ev.Kind, ev.Func, ev.PID, ev.TID, ev.Time = trace.KindCopy, f, p.pid, p.pid, now
	ev.Copy.Dir, ev.Copy.Bytes, ev.Copy.Stream = op.Dir, op.Bytes, streamHandle
}

// emitSync reports p's synchronization, from start to its return at now.
func (s *Simulator) emitSync(p *proc, start, now uint64) {
	if s.cfg.observe {
		s.syncEvent(p, start, now)
	}
}

// syncEvent is emitSync's event.
func (s *Simulator) syncEvent(p *proc, start, now uint64) {
	ev := s.emit(1)
	ev.Kind, ev.Func, ev.PID, ev.TID, ev.Time = trace.KindSync, trace.FuncStreamSynchronize, p.pid, p.pid, start
	ev.Sync.Handle, ev.Sync.Duration = streamHandle, now-start
}
