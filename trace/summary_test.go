package trace

import (
	"math"
	"testing"
	"time"
)

const us = uint64(time.Microsecond)

func launchAt(pid uint32, t uint64) Event {
	return Event{Kind: KindLaunch, Func: FuncLaunchKernel, PID: pid, TID: pid, Time: t}
}

func copyAt(pid uint32, t uint64, dir CopyDir, n uint64) Event {
	return Event{Kind: KindCopy, Func: FuncMemcpyHtoDAsyncV2, PID: pid, TID: pid, Time: t, Copy: Copy{Dir: dir, Bytes: n}}
}

func syncAt(pid uint32, t, dur uint64, result int32) Event {
	return Event{Kind: KindSync, Func: FuncStreamSynchronize, PID: pid, TID: pid, Time: t,
		Sync: Sync{Duration: dur, Result: result}}
}

// request is one inference request at t: copy, n launches 10 µs apart,
// copy, and a sync of dur ns reported (out of order) after the launches.
func request(pid uint32, t uint64, n int, dur uint64) []Event {
	evs := []Event{copyAt(pid, t, CopyHtoD, 4096)}
	for i := 0; i < n; i++ {
		evs = append(evs, launchAt(pid, t+uint64(i+1)*10*us))
	}
	evs = append(evs, copyAt(pid, t+uint64(n+1)*10*us, CopyDtoH, 1024))
	return append(evs, syncAt(pid, t+uint64(n+2)*10*us, dur, 0))
}

func TestSummaryRequests(t *testing.T) {
	tests := []struct {
		name     string
		gap      time.Duration
		events   []Event
		want     ProcessSummary
		rate     float64 // 0: active too briefly for a rate
		activeNS uint64
	}{
		{
			name: "three requests 5 ms apart, 2 ms gap",
			events: concat(request(7, 0, 4, 1000*us), request(7, 5000*us, 4, 1000*us),
				request(7, 10000*us, 4, 1000*us)),
			// Each request: copy at t, launches t+10..40 µs, copy t+50, sync t+60 for 1 ms
			// ending t+1060 µs; next starts 3940 µs later > 2 ms.
			want: ProcessSummary{PID: 7, Launches: 12, Copies: 6, CopyBytes: 3 * 5120, HtoDBytes: 3 * 4096,
				DtoHBytes: 3 * 1024, Syncs: 3, SyncTime: 3000 * us, MaxSync: 1000 * us, Requests: 3,
				First: 0, Last: 11060 * us},
			activeNS: 11060 * us,
		},
		{
			name: "same requests with a 5 ms gap merge into one",
			gap:  5 * time.Millisecond,
			events: concat(request(7, 0, 4, 1000*us), request(7, 5000*us, 4, 1000*us),
				request(7, 10000*us, 4, 1000*us)),
			want: ProcessSummary{PID: 7, Launches: 12, Copies: 6, CopyBytes: 3 * 5120, HtoDBytes: 3 * 4096,
				DtoHBytes: 3 * 1024, Syncs: 3, SyncTime: 3000 * us, MaxSync: 1000 * us, Requests: 1,
				First: 0, Last: 11060 * us},
			activeNS: 11060 * us,
		},
		{
			name: "a long sync keeps the period busy: the gap counts from its return",
			// Launch at 0, sync 100 µs..5100 µs, launch at 6000 (900 µs after the
			// sync returned: same request), launch at 9000 (2900 µs idle: new).
			events: []Event{launchAt(1, 0), syncAt(1, 100*us, 5000*us, 0), launchAt(1, 6000*us), launchAt(1, 9000*us)},
			want: ProcessSummary{PID: 1, Launches: 3, Syncs: 1, SyncTime: 5000 * us, MaxSync: 5000 * us,
				Requests: 2, First: 0, Last: 9000 * us},
			activeNS: 9000 * us,
		},
		{
			name:     "exactly the gap is not idle enough; one ns more is",
			events:   []Event{launchAt(2, 1000), launchAt(2, 1000+2000*us), launchAt(2, 1000+4000*us+1)},
			want:     ProcessSummary{PID: 2, Launches: 3, Requests: 2, First: 1000, Last: 1000 + 4000*us + 1},
			activeNS: 4000*us + 1,
		},
		{
			name: "sync errors and out-of-order arrival",
			// The sync entered at 50 µs but is reported after a launch at 80 µs.
			events: []Event{launchAt(3, 100*us), launchAt(3, 180*us), syncAt(3, 50*us, 20*us, 400)},
			want: ProcessSummary{PID: 3, Launches: 2, Syncs: 1, SyncTime: 20 * us, MaxSync: 20 * us, SyncErrors: 1,
				Requests: 1, First: 50 * us, Last: 180 * us},
			activeNS: 130 * us,
		},
		{
			name: "exec names, exit records; lifecycle is no activity",
			events: []Event{
				{Kind: KindExec, PID: 4, Time: 0, Proc: Proc{Comm: comm("infer")}},
				launchAt(4, 10*ms),
				{Kind: KindExit, PID: 4, Time: 50 * ms, Proc: Proc{Comm: comm("infer"), ExitCode: 9}},
			},
			want: ProcessSummary{PID: 4, Comm: "infer", Launches: 1, Requests: 1, First: 10 * ms, Last: 10 * ms,
				Exited: true, ExitCode: 9},
		},
		{
			name: "a burst of 800 launches in 1 ms has no rate",
			events: func() []Event {
				var evs []Event
				for i := uint64(0); i < 800; i++ {
					evs = append(evs, launchAt(6, i*1250))
				}
				return evs
			}(),
			want:     ProcessSummary{PID: 6, Launches: 800, Requests: 1, First: 0, Last: 799 * 1250},
			activeNS: 799 * 1250,
		},
		{
			name:     "launches over 1.5 s have a rate",
			events:   []Event{launchAt(8, 0), launchAt(8, 500*ms), launchAt(8, 1000*ms), launchAt(8, 1500*ms)},
			want:     ProcessSummary{PID: 8, Launches: 4, Requests: 4, First: 0, Last: 1500 * ms},
			rate:     4 / 1.5,
			activeNS: 1500 * ms,
		},
		{
			name:     "exactly MinRateWindow is enough",
			events:   []Event{launchAt(9, 0), launchAt(9, 1000*ms)},
			want:     ProcessSummary{PID: 9, Launches: 2, Requests: 2, First: 0, Last: 1000 * ms},
			rate:     2,
			activeNS: 1000 * ms,
		},
		{
			name:   "only lifecycle",
			events: []Event{{Kind: KindExit, PID: 5, Proc: Proc{Comm: comm("sh")}}},
			want:   ProcessSummary{PID: 5, Comm: "sh", Exited: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSummary(&SummaryOptions{IdleGap: tt.gap})
			for i := range tt.events {
				s.Add(&tt.events[i])
			}
			got, ok := s.Process(tt.want.PID)
			if !ok {
				t.Fatalf("no summary for pid %d", tt.want.PID)
			}
			if got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
			r, ok := got.LaunchRate()
			if ok != (tt.rate != 0) || math.Abs(r-tt.rate) > 1e-6*max(1, tt.rate) {
				t.Errorf("LaunchRate = %v, %v; want %v", r, ok, tt.rate)
			}
			if a := got.Active(); a != time.Duration(tt.activeNS) {
				t.Errorf("Active = %v, want %v", a, time.Duration(tt.activeNS))
			}
		})
	}
}

const ms = uint64(time.Millisecond)

func comm(s string) (c [16]byte) {
	copy(c[:], s)
	return c
}

func concat(parts ...[]Event) []Event {
	var out []Event
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestSummaryProcessesSortedAndSeparate(t *testing.T) {
	s := NewSummary(nil)
	if s.IdleGap() != DefaultIdleGap {
		t.Errorf("default gap %v", s.IdleGap())
	}
	for _, ev := range []Event{launchAt(30, 0), launchAt(10, 0), launchAt(30, 1), launchAt(20, 0)} {
		s.Add(&ev)
	}
	s.SetComm(20, "train")
	ps := s.Processes()
	if len(ps) != 3 || ps[0].PID != 10 || ps[1].PID != 20 || ps[2].PID != 30 {
		t.Fatalf("processes %+v", ps)
	}
	if ps[2].Launches != 2 || ps[0].Launches != 1 || ps[1].Comm != "train" {
		t.Errorf("processes %+v", ps)
	}
	if _, ok := s.Process(99); ok {
		t.Error("unknown pid reported")
	}
	if r, ok := ps[0].LaunchRate(); ok || r != 0 {
		t.Errorf("rate of a process active for no time = %v, %v; want none", r, ok)
	}
}
