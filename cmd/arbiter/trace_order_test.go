package main

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

func TestOrderBuffer(t *testing.T) {
	const ms = uint64(time.Millisecond)
	at := func(t uint64, pid uint32) *trace.Event {
		return &trace.Event{Kind: trace.KindLaunch, PID: pid, Time: t}
	}
	b := newOrderBuffer(20*time.Millisecond, 100)
	// Two CPUs' events interleaved out of order, and a sync entered at
	// 1 ms reported at its return after later events.
	b.push(at(2*ms, 1), "a")
	b.push(at(3*ms, 2), "b")
	b.push(at(1*ms, 3), "sync")
	b.push(at(3*ms, 4), "same time, later")
	if _, ok := b.next(0); ok {
		t.Fatal("released an event before a window passed")
	}
	// The clock, not only the events, releases them: 22 ms is a window
	// after 2 ms but not after 3 ms.
	var got []uint32
	for h, ok := b.next(22 * ms); ok; h, ok = b.next(22 * ms) {
		got = append(got, h.ev.PID)
	}
	if !slices.Equal(got, []uint32{3, 1}) {
		t.Errorf("released %v at 22 ms, want [3 1]", got)
	}
	// A newer event releases the older ones too (a replay has no clock).
	b.push(at(40*ms, 5), "late")
	got = got[:0]
	for h, ok := b.next(0); ok; h, ok = b.next(0) {
		got = append(got, h.ev.PID)
		if h.ev.PID == 4 && h.comm != "same time, later" {
			t.Errorf("comm %q kept with pid 4", h.comm)
		}
	}
	if !slices.Equal(got, []uint32{2, 4}) || b.len() != 1 {
		t.Errorf("released %v on a newer event, %d held; want [2 4], 1 held", got, b.len())
	}
	if h, ok := b.flush(); !ok || h.ev.PID != 5 {
		t.Errorf("flush: %v %v", h, ok)
	}
	if _, ok := b.flush(); ok {
		t.Error("flush of an empty buffer")
	}

	// The limit pushes the oldest out whatever its age.
	small := newOrderBuffer(time.Hour, 2)
	for i := uint64(3); i > 0; i-- {
		small.push(at(i, uint32(i)), "")
	}
	if h, ok := small.next(0); !ok || h.ev.PID != 1 {
		t.Errorf("over the limit: %v %v, want the oldest (pid 1)", h, ok)
	}
	if _, ok := small.next(0); ok {
		t.Error("released below the limit")
	}
}

// TestOrderBufferSorts pushes events shuffled within a window and checks
// that they come out sorted, with slots reused.
func TestOrderBufferSorts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n, window = 20000, 1000
	times := make([]uint64, n)
	for i := range times {
		// Each event is at most window-1 later than its position.
		times[i] = uint64(i) + uint64(r.IntN(window))
	}
	b := newOrderBuffer(window, 1<<20)
	var out []uint64
	for _, tm := range times {
		b.push(&trace.Event{Time: tm}, "")
		for h, ok := b.next(0); ok; h, ok = b.next(0) {
			out = append(out, h.ev.Time)
		}
	}
	for h, ok := b.flush(); ok; h, ok = b.flush() {
		out = append(out, h.ev.Time)
	}
	if len(out) != n || !slices.IsSorted(out) {
		t.Fatalf("%d events out, sorted %v", len(out), slices.IsSorted(out))
	}
	if len(b.slots) > 3*window {
		t.Errorf("%d slots for a window of %d events: slots not reused", len(b.slots), window)
	}
}

// TestTraceReplayInTimeOrder replays a file whose events are out of time
// order as the ring buffer delivers them: they print sorted.
func TestTraceReplayInTimeOrder(t *testing.T) {
	const ms = uint64(time.Millisecond)
	base := 1000 * ms
	launch := func(pid uint32, tm uint64) trace.Event {
		return trace.Event{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: pid, TID: pid, Time: base + tm}
	}
	sync := trace.Event{Kind: trace.KindSync, Func: trace.FuncStreamSynchronize, PID: 1, TID: 1, Time: base + 2*ms,
		Sync: trace.Sync{Duration: 5 * ms}}
	evs := []trace.Event{
		launch(1, 0), launch(2, 3*ms), launch(2, 1*ms), // CPUs apart
		launch(2, 4*ms), launch(2, 6*ms), sync, // reported at its return
		launch(2, 100*ms),
	}
	stdout, _, err := runCmd(t, "trace", "--replay", writeReplay(t, evs))
	if err != nil {
		t.Fatal(err)
	}
	var times []string
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		times = append(times, strings.Fields(line)[0])
	}
	want := []string{"0.000000", "0.001000", "0.002000", "0.003000", "0.004000", "0.006000", "0.100000"}
	if !slices.Equal(times, want) {
		t.Errorf("times %v, want %v\n%s", times, want, stdout)
	}
}
