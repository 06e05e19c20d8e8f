package trace

import (
	"testing"
	"time"
)

func TestRequestTracker(t *testing.T) {
	type step struct {
		ev       Event
		opened   bool
		deadline uint64 // 0: none
	}
	tests := []struct {
		name         string
		gap, timeout time.Duration
		steps        []step
		want         Request
	}{
		{
			name: "a request: copy, launches, sync; idle a gap after the sync returns",
			gap:  2 * time.Millisecond, timeout: time.Second,
			steps: []step{
				{copyAt(1, 100*us, CopyHtoD, 64), true, 100*us + uint64(time.Second)},
				{launchAt(1, 110*us), false, 110*us + uint64(time.Second)},
				{syncAt(1, 120*us, 500*us, 0), false, 620*us + 2000*us},
			},
			want: Request{Start: 100 * us, End: 620 * us},
		},
		{
			name: "without a timeout only a synchronization starts the gap",
			gap:  0,
			steps: []step{
				{launchAt(1, 10), true, 0},
				{syncAt(1, 20, 30, 0), false, 50},
				{launchAt(1, 60), false, 0},
			},
			want: Request{Start: 10, End: 60},
		},
		{
			name: "out of order: a sync reported after later calls never moves the end back",
			gap:  time.Microsecond, timeout: time.Microsecond,
			steps: []step{
				{launchAt(1, 100*us), true, 101 * us},
				{launchAt(1, 180*us), false, 181 * us},
				{syncAt(1, 50*us, 20*us, 0), false, 181 * us},
			},
			want: Request{Start: 50 * us, End: 180 * us},
		},
		{
			name: "a launch reported after a longer sync times out from the sync's end",
			gap:  time.Microsecond, timeout: 10 * time.Microsecond,
			steps: []step{
				{syncAt(1, 0, 500*us, 0), true, 501 * us},
				{launchAt(1, 200*us), false, 510 * us},
			},
			want: Request{Start: 0, End: 500 * us},
		},
		{
			name:  "lifecycle and driver-object events are no calls",
			gap:   time.Millisecond,
			steps: []step{{Event{Kind: KindExec, PID: 1, Time: 5}, false, 0}, {Event{Kind: KindRMAlloc, PID: 1, Time: 6}, false, 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewRequestTracker(tt.gap, tt.timeout)
			for i, s := range tt.steps {
				if got := tr.Call(&s.ev); got != s.opened {
					t.Errorf("step %d: opened %v, want %v", i, got, s.opened)
				}
				d, ok := tr.Deadline()
				if ok != (s.deadline != 0) || d != s.deadline {
					t.Errorf("step %d: deadline %d, %v; want %d", i, d, ok, s.deadline)
				}
			}
			if got := tr.Current(); got != tt.want {
				t.Errorf("current %+v, want %+v", got, tt.want)
			}
			if tr.Active() != (tt.want != Request{}) {
				t.Errorf("active %v with request %+v", tr.Active(), tt.want)
			}
			if got := tr.End(); got != tt.want || tr.Active() || tr.Current() != (Request{}) {
				t.Errorf("End = %+v (active after: %v), want %+v", got, tr.Active(), tt.want)
			}
			if _, ok := tr.Deadline(); ok {
				t.Error("a deadline with no request open")
			}
		})
	}
}

func TestRequestTrackerOpensAgainAfterEnd(t *testing.T) {
	tr := NewRequestTracker(time.Millisecond, time.Second)
	evs := []Event{launchAt(1, 0), syncAt(1, 10, 90, 0)}
	for i := range evs {
		tr.Call(&evs[i])
	}
	if r := tr.End(); r.Latency() != 100 {
		t.Fatalf("latency %d, want 100", r.Latency())
	}
	next := launchAt(1, 5*ms)
	if !tr.Call(&next) {
		t.Fatal("a call after End did not open a request")
	}
	if r := tr.Current(); r.Start != 5*ms || r.End != 5*ms {
		t.Errorf("second request %+v", r)
	}
	var zero RequestTracker
	zero.Call(&next)
	if _, ok := zero.Deadline(); ok {
		t.Error("the zero tracker has a deadline after a launch")
	}
	if neg := NewRequestTracker(-time.Second, -time.Second); neg.idleGap != 0 || neg.timeout != 0 {
		t.Errorf("negative gaps kept: %+v", neg)
	}
}
