package uprobe

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/cilium/ebpf"
)

// Expedite lists pid (a thread-group id) among the processes whose
// requests Read must return at once (on), or takes it off the list (off).
// Below the ring's fill threshold the probes do not wake the reader, which
// then finds records at its next poll, up to pollInterval (10 ms) later;
// a listed process's launch or copy that opens a request (the process idle
// for Options.ExpediteGap before it) wakes the reader instead, so that the
// daemon can preempt for the request while it runs. Its other calls wait
// for the poll, or for the next record that wakes the reader. The daemon
// lists its latency-critical processes: wake-ups cost the probe a kernel
// entry each, which is affordable once per request of a few processes,
// not for every call of every process.
//
// Both directions are idempotent. At most 8,192 processes are listed at
// once (an error says so beyond); an exited process leaves the list by
// itself. After Close it returns ErrClosed.
func (t *Tracer) Expedite(pid uint32, on bool) error {
	t.expMu.Lock()
	defer t.expMu.Unlock()
	select {
	case <-t.done:
		return ErrClosed
	default:
	}
	m := t.objs.maps.Expedite
	if !on {
		if _, ok := t.expedited[pid]; !ok {
			return nil
		}
		if err := m.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("stop expediting pid %d: %w", pid, err)
		}
		delete(t.expedited, pid)
		if len(t.expedited) == 0 {
			if err := t.objs.vars.ExpediteListed.Set(uint32(0)); err != nil {
				return fmt.Errorf("stop expediting pid %d: clear the probes' flag: %w", pid, err)
			}
		}
		return nil
	}
	// The flag first: a probe that sees the entry must also look it up.
	if err := t.objs.vars.ExpediteListed.Set(uint32(1)); err != nil {
		return fmt.Errorf("expedite pid %d: set the probes' flag: %w", pid, err)
	}
	// A new entry's idle time of 0 makes the process's next launch or copy
	// wake the reader; an entry that exists keeps its time.
	err := m.Update(pid, uint64(0), ebpf.UpdateNoExist)
	switch {
	case err == nil, errors.Is(err, ebpf.ErrKeyExist):
	case errors.Is(err, syscall.E2BIG): // the hash is full
		return fmt.Errorf("expedite pid %d: %d processes are expedited already, the most the tracer holds: its requests reach the daemon at the reader's poll instead", pid, m.MaxEntries())
	default:
		return fmt.Errorf("expedite pid %d: %w", pid, err)
	}
	t.expedited[pid] = struct{}{}
	if len(t.expedited) > int(m.MaxEntries()) {
		// Processes whose exit the caller never saw: the probes dropped
		// them from the map, drop them here too.
		for p := range t.expedited {
			var v uint64
			if errors.Is(m.Lookup(p, &v), ebpf.ErrKeyNotExist) {
				delete(t.expedited, p)
			}
		}
	}
	return nil
}
