package sim

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// TestReadBatchEqualsRead: ReadBatch hands out the events Read returns
// one by one (a burst's launches as one, counted), and the same deadline expiries at the same
// virtual times, whatever deadlines the reader sets between them.
func TestReadBatchEqualsRead(t *testing.T) {
	durs := []uint64{300 * us, 450 * us, 120 * us}
	prog := func() Program {
		sc := &script{}
		for range 3 {
			sc.ops = append(sc.ops, Op{Kind: OpKernel, Dur: 870 * us, Count: 3, Burst: &lazyBurst{durs: durs, exact: true}},
				Op{Kind: OpCopy, Bytes: 4096}, Op{Kind: OpSync}, Op{Kind: OpSleep, Dur: 700 * us})
		}
		return sc
	}
	read := func(batch bool) []string {
		s, _ := mustSim(t, &Options{Observe: true, Mode: ModePriority}, Process{Name: "A", Class: ClassLC, Program: prog()},
			Process{Name: "B", Program: kernels(500*us, 500*us, 2000*us)})
		s.Start(uint64(time.Second))
		var got []string
		// The reader sets a deadline 400 µs after every synchronization.
		handle := func(ev *trace.Event) {
			got = append(got, fmt.Sprintf("%+v", *ev))
			if ev.Kind == trace.KindSync {
				if err := s.SetReadDeadline(ev.Time + ev.Sync.Duration + 400*us); err != nil {
					t.Fatal(err)
				}
			}
		}
		for {
			var err error
			if batch {
				var evs []trace.Event
				var counts []uint32
				if evs, counts, err = s.ReadBatch(); err == nil {
					for i := range evs {
						for range counts[i] {
							handle(&evs[i])
						}
					}
					continue
				}
			} else {
				var ev trace.Event
				if err = s.Read(&ev); err == nil {
					handle(&ev)
					continue
				}
			}
			switch {
			case errors.Is(err, trace.ErrDeadline):
				got = append(got, fmt.Sprintf("deadline at %d", s.Now()))
				if err := s.SetReadDeadline(0); err != nil {
					t.Fatal(err)
				}
			case errors.Is(err, io.EOF):
				return got
			default:
				t.Fatal(err)
			}
		}
	}
	one, batched := read(false), read(true)
	if !slices.Equal(one, batched) {
		t.Errorf("ReadBatch differs from Read:\n%v\n%v", one, batched)
	}
	if n := strings.Count(strings.Join(one, "\n"), "deadline at"); n != 4 {
		t.Errorf("%d deadlines, want 4: %v", n, one)
	}
}
