// Tests with real eBPF of where a synchronizer's entry waits for its
// return: a per-thread slot of an array, or the thread's task-local storage
// where another thread holds the slot.

package uprobe

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestSyncSlotsShared runs threads that wait in cuStreamSynchronize at the
// same time, with the default slot count and with a single slot for all of
// them (every thread but the slot's holder then keeps its entry in task
// storage), and checks that every sync of every thread arrives with its
// own thread and stream, and nearly every one with a duration covering
// its kernel.
func TestSyncSlotsShared(t *testing.T) {
	r := newRig(t)
	const threads, n, us = 8, 40, 300
	for _, slots := range []int{0, 1} {
		t.Run(fmt.Sprintf("slots=%d", slots), func(t *testing.T) {
			// Only this process is traced: others that use the same stub
			// library (other tests) must not hold the slot.
			p := r.start(t, nil, true, "threads", strconv.Itoa(threads), strconv.Itoa(n), strconv.Itoa(us))
			o := r.options()
			o.syncSlots, o.PIDs = slots, []uint32{p.pid}
			tr := openTracer(t, o)
			p.send(t, "go")
			stream := map[uint32]uint64{}
			for range threads {
				var tid uint32
				var s uint64
				if _, err := fmt.Sscanf(p.line(t), "tid=%d stream=%d", &tid, &s); err != nil {
					t.Fatal(err)
				}
				stream[tid] = s
			}
			got, short := map[uint32]int{}, 0
			var bad []string
			collect(t, tr, time.Minute, func(ev *trace.Event) bool {
				if ev.PID != p.pid {
					return false
				}
				if ev.Kind == trace.KindSync {
					got[ev.TID]++
					s, ok := stream[ev.TID]
					// A sync paired with another thread's entry carries
					// that thread's stream (each thread has its own), which
					// the handle check catches; a wrapped duration, the
					// minute's bound. A thread that the machine's other work
					// kept off the CPU between its launch and its sync finds
					// the kernel done and returns at once: a few such are
					// counted, not failed.
					if !ok || ev.Func != trace.FuncStreamSynchronize || ev.Sync.Handle != s || ev.Sync.Result != 0 ||
						ev.Sync.Duration > uint64(time.Minute) {
						if len(bad) < 5 {
							bad = append(bad, fmt.Sprintf("%+v (thread's stream %d)", *ev, s))
						}
					}
					if ev.Sync.Duration < us*1000/2 {
						short++
					}
				}
				return ev.Kind == trace.KindExit
			})
			if short > threads*n/4 {
				t.Errorf("%d of %d syncs lasted less than half their %d µs kernel: want most to cover it", short, threads*n, us)
			}
			p.wait(t)
			for tid := range stream {
				if got[tid] != n {
					t.Errorf("thread %d: %d syncs seen of %d", tid, got[tid], n)
				}
			}
			if len(bad) > 0 {
				t.Errorf("syncs with wrong fields:\n%s", strings.Join(bad, "\n"))
			}
			if s := tr.Stats(); s.Drops != 0 || s.DecodeErrors != 0 {
				t.Errorf("%d drops, %d decode errors: want none", s.Drops, s.DecodeErrors)
			}
		})
	}
}

// TestSyncSlotFreedAtExit kills a process whose thread waits in a
// synchronizer, so that its return probe never runs, and checks that the
// exit tracepoint frees the thread's slot.
func TestSyncSlotFreedAtExit(t *testing.T) {
	r := newRig(t)
	p := r.start(t, nil, true, "threads", "1", "1", "30000000") // a 30 s kernel
	o := r.options()
	o.syncSlots, o.PIDs = 1, []uint32{p.pid}
	tr := openTracer(t, o)
	p.send(t, "go")
	var tid uint32
	var s uint64
	if _, err := fmt.Sscanf(p.line(t), "tid=%d stream=%d", &tid, &s); err != nil {
		t.Fatal(err)
	}
	owner := func() uint64 {
		var slot bpf.CudaSyncSlot
		if err := tr.objs.maps.SyncSlots.Lookup(uint32(0), &slot); err != nil {
			t.Fatal(err)
		}
		return slot.Owner
	}
	want := uint64(p.pid)<<32 | uint64(tid)
	deadline := time.Now().Add(30 * time.Second)
	for owner() != want {
		if time.Now().After(deadline) {
			t.Fatalf("slot owner %#x, want the waiting thread %#x", owner(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	// The exit tracepoint ran before wait returned.
	if o := owner(); o != 0 {
		t.Errorf("slot owner %#x after the thread was killed in its sync, want 0 (free)", o)
	}
}
