package main

import "github.com/gpu-arbiter/arbiter/trace"

// maxHeldExecs bounds the exec events held for processes that have not made
// a driver call yet; one whose exit was lost stays held until this many
// others wait, then new execs are dropped rather than held.
const maxHeldExecs = 1 << 16

// lifecycleFilter shows a process's exec and exit only once it is a CUDA
// process: without a filter the kernel reports every exec and exit on the
// node, and compilers, shells and greps would bury the few processes that
// use the GPU. It holds a process's exec until its first driver call
// (launch, copy, sync or RM call), shows the exec then, and drops the exec
// and exit of a process that never made one. Processes the user selected
// by --pid or --comm are shown whole. It sees events in time order.
type lifecycleFilter struct {
	// selected reports whether the user named ev's process; nil: none was.
	selected func(ev *trace.Event, comm string) bool
	held     map[uint32]heldEvent
	cuda     map[uint32]bool
}

func newLifecycleFilter(selected func(*trace.Event, string) bool) *lifecycleFilter {
	return &lifecycleFilter{selected: selected, held: map[uint32]heldEvent{}, cuda: map[uint32]bool{}}
}

// pass hands ev to emit when it is to be shown, preceded by its process's
// held exec when ev is the process's first driver call.
func (l *lifecycleFilter) pass(ev *trace.Event, comm string, emit func(*trace.Event, string) error) error {
	if l.selected != nil && l.selected(ev, comm) {
		return emit(ev, comm)
	}
	switch ev.Kind {
	case trace.KindExec:
		if l.cuda[ev.PID] {
			// A CUDA process replacing its image: part of a story shown.
			return emit(ev, comm)
		}
		if _, ok := l.held[ev.PID]; ok || len(l.held) < maxHeldExecs {
			l.held[ev.PID] = heldEvent{ev: *ev, comm: comm}
		}
		return nil
	case trace.KindExit:
		delete(l.held, ev.PID)
		if !l.cuda[ev.PID] {
			return nil
		}
		delete(l.cuda, ev.PID)
		return emit(ev, comm)
	}
	if !l.cuda[ev.PID] {
		l.cuda[ev.PID] = true
		if h, ok := l.held[ev.PID]; ok {
			delete(l.held, ev.PID)
			if err := emit(&h.ev, h.comm); err != nil {
				return err
			}
		}
	}
	return emit(ev, comm)
}
