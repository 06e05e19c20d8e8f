package uprobe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cilium/ebpf"

	"github.com/gpu-arbiter/arbiter/bpf"
)

// MaxArmed is how many processes Arm can arm for one latency-critical
// process; the rest are gated by Gate alone.
const MaxArmed = len(bpf.CudaArmed{}.Victims)

// Arm lists the processes whose gates the kernel closes at the call that
// opens each request of lc (a latency-critical process the tracer
// expedites, Tracer.Expedite): its launch or copy after an idle gap of
// Options.ExpediteGap, or only its launch with launchOnly. The gates close
// in lc's own probe, before its record reaches the daemon, so that a
// victim is stopped at its next launch without waiting for the daemon to
// react (hundreds of microseconds, in which it may submit another
// kernel). No victims disarms lc.
//
// The caller owns what the kernel closes: it takes a gate over with Gate
// (which finds it closed and keeps it so) or lets Settle open it, and it
// must do one or the other at the end of each request, or whenever it
// rearms, so that no process stays stopped. Arming lives in the tracer's
// programs: it ends with the tracer (Close disarms first, then opens
// every gate), and a killed daemon's probes go with it, so a gate closed
// in the kernel is released by the next start or `arbiter recover` like
// any other.
//
// A victim's gate closes only where its launch probes are attached (see
// Gate); a victim that has exited is left out. At most MaxArmed victims
// are armed: beyond that, the first MaxArmed still running are, and Arm
// returns an error saying how many were given (the rest are gated when
// the daemon sees the request).
func (g *Gate) Arm(lc uint32, victims []uint32, launchOnly bool) error {
	if g.armed == nil || g.probed == nil {
		return fmt.Errorf("arm gates for process %d: this gate was opened from its pin without a tracer", lc)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(victims) == 0 {
		if err := g.armed.Delete(lc); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("disarm the gates of process %d's requests: %w", lc, err)
		}
		return nil
	}
	var a bpf.CudaArmed
	if launchOnly {
		a.LaunchOnly = 1
	}
	for _, v := range victims {
		if int(a.N) == MaxArmed {
			break
		}
		start, err := procStart(g.procRoot, v)
		if errors.Is(err, os.ErrNotExist) {
			continue // exited: nothing to gate
		}
		if err != nil {
			return fmt.Errorf("arm process %d's gate for process %d's requests: %w", v, lc, err)
		}
		a.Victims[a.N].Tgid = v
		a.Victims[a.N].Start = start * tickNs
		a.N++
	}
	if err := g.armed.Put(lc, &a); err != nil {
		return fmt.Errorf("arm gates for process %d's requests: %w (at most %d processes may have armed gates)", lc, err, g.armed.MaxEntries())
	}
	if len(victims) > MaxArmed {
		return fmt.Errorf("arm gates for process %d's requests: %d victims, at most %d armed; the rest close when the daemon sees the request", lc, len(victims), MaxArmed)
	}
	return nil
}

// DefaultSettleGrace is how young a gate that an armed request closed
// may be for Settle to leave it closed: the time within which the
// request's first call reaches the daemon and the engine takes the gate
// over. An armed process is expedited, so that call wakes the reader
// (200–430 µs on the development guest); the grace leaves ten times that
// for a busy node. It is short because a gate the engine does not take
// over (victims that changed between arming and the request) stays
// closed until a settle finds it older: at a request's end, or else at
// the next control tick.
const DefaultSettleGrace = 5 * time.Millisecond

// Settle opens every gate that an armed request closed at least grace ago
// and Gate has not taken over (a gate Gate closed, or found closed, stays
// closed until Ungate), as Ungate does each. A gate closed more recently
// may belong to a request whose first call has not reached the caller
// yet, which would take it over on seeing that call: Settle leaves it
// closed and counts it in young, for a later Settle. It also continues
// every process a stop record names whose gate is open (an opener failed
// to continue it). It goes on past failures; the error joins them all.
func (g *Gate) Settle(grace time.Duration) (opened []Release, young int, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		return nil, 0, fmt.Errorf("settle the armed gates: read the monotonic clock: %w", err)
	}
	opened, err = g.openWhere(func(pid uint32, v []byte) bool {
		if _, held := g.held[pid]; held {
			return false
		}
		if at := armedAt(v); at != 0 && armedAge(now.Nano(), at) < grace {
			young++
			return false
		}
		return true
	})
	return opened, young, err
}

// armedAt returns when an armed request closed a gate, from the entry's
// value (bpf/cuda.c, gate_entry.armed_at): 0 where the daemon closed it.
func armedAt(v []byte) uint32 {
	if len(v) < 16 {
		return 0
	}
	return binary.NativeEndian.Uint32(v[12:])
}

// armedAge is how long ago, at now (CLOCK_MONOTONIC, ns), an armed
// request closed a gate whose armed_at is at. The clock's 1,024 ns units
// are truncated to 32 bits, so the difference is taken modulo 2^32 (73
// minutes: a gate left closed that long reads young for a grace period
// once, and is opened at a later Settle); at's lowest bit, set to keep it
// nonzero, may put it one unit ahead of the clock, which is no age.
func armedAge(now int64, at uint32) time.Duration {
	d := uint32(uint64(now)>>10) - at
	if d == math.MaxUint32 {
		d = 0
	}
	return time.Duration(d) << 10
}

// ArmedCloses returns how many gates armed requests closed, over every
// CPU; zero for a gate opened from its pin.
func (g *Gate) ArmedCloses() uint64 { return g.counter(2) }

// disarmAll disarms every process and waits until no probe that could
// still close an armed gate is in flight, so that an opening that
// follows is final.
func (g *Gate) disarmAll() error {
	if g.armed == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var lcs []uint32
	var lc uint32
	var v []byte
	it := g.armed.Iterate()
	for it.Next(&lc, &v) {
		lcs = append(lcs, lc)
	}
	errs := []error{it.Err()}
	for _, lc := range lcs {
		if err := g.armed.Delete(lc); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("disarm the gates of process %d's requests: %w", lc, err))
		}
	}
	if len(lcs) > 0 {
		errs = append(errs, g.waitProbes())
	}
	return errors.Join(errs...)
}
