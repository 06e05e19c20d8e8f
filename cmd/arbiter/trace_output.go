package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// eventPrinter writes one line per event.
type eventPrinter interface {
	// print writes ev; first is the first event's time (text output shows
	// times relative to it) and comm the process name ("" if unknown).
	print(ev *trace.Event, first uint64, comm string) error
}

func newEventPrinter(format string, w io.Writer) eventPrinter {
	if format == "json" {
		return &jsonPrinter{enc: json.NewEncoder(w)}
	}
	return &textPrinter{w: w}
}

// textPrinter writes aligned, human-readable lines:
//
//	0.000150 4242/4242 infer           launch cuLaunchKernel fn=0x40 stream=0x3 grid=64x1x1 block=256x1x1 smem=0
type textPrinter struct {
	w   io.Writer
	buf []byte
}

func (p *textPrinter) print(ev *trace.Event, first uint64, comm string) error {
	b := p.buf[:0]
	rel := int64(ev.Time - first)
	b = fmt.Appendf(b, "%12.6f %-13s %-15s %-6s", float64(rel)/1e9,
		strconv.FormatUint(uint64(ev.PID), 10)+"/"+strconv.FormatUint(uint64(ev.TID), 10), orDash(comm), ev.Kind)
	if ev.Func != trace.FuncNone {
		b = append(b, ' ')
		b = append(b, ev.Func.String()...)
	}
	switch ev.Kind {
	case trace.KindLaunch:
		l := &ev.Launch
		b = fmt.Appendf(b, " fn=%#x stream=%#x grid=%dx%dx%d block=%dx%dx%d smem=%d", l.Function, l.Stream,
			l.Grid[0], l.Grid[1], l.Grid[2], l.Block[0], l.Block[1], l.Block[2], l.SharedMem)
	case trace.KindCopy:
		c := &ev.Copy
		b = fmt.Appendf(b, " %s bytes=%d dev=%#x host=%#x stream=%#x", c.Dir, c.Bytes, c.Device, c.Host, c.Stream)
	case trace.KindSync:
		s := &ev.Sync
		b = fmt.Appendf(b, " handle=%#x", s.Handle)
		if s.Other != 0 {
			b = fmt.Appendf(b, " other=%#x", s.Other)
		}
		b = fmt.Appendf(b, " took=%s result=%s", time.Duration(s.Duration).Round(time.Microsecond), cuResultName(s.Result))
	case trace.KindExec:
		b = fmt.Appendf(b, " ppid=%d", ev.Proc.PPID)
	case trace.KindExit:
		b = fmt.Appendf(b, " code=%d", ev.Proc.ExitCode)
	case trace.KindRMAlloc, trace.KindRMFree, trace.KindRMControl:
		r := &ev.RM
		b = fmt.Appendf(b, " fd=%d client=%#x parent=%#x object=%#x class=%#x engine=%d cmd=%#x value=%d status=%#x",
			r.FD, r.Client, r.Parent, r.Object, r.Class, r.EngineType, r.Cmd, r.Value, r.Status)
	}
	b = append(b, '\n')
	p.buf = b
	_, err := p.w.Write(b)
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// cuResultName names the common CUresult codes, else gives the number.
func cuResultName(r int32) string {
	switch r {
	case 0:
		return "CUDA_SUCCESS"
	case 1:
		return "CUDA_ERROR_INVALID_VALUE"
	case 2:
		return "CUDA_ERROR_OUT_OF_MEMORY"
	case 3:
		return "CUDA_ERROR_NOT_INITIALIZED"
	case 4:
		return "CUDA_ERROR_DEINITIALIZED"
	case 201:
		return "CUDA_ERROR_INVALID_CONTEXT"
	case 400:
		return "CUDA_ERROR_INVALID_HANDLE"
	case 600:
		return "CUDA_ERROR_NOT_READY"
	case 700:
		return "CUDA_ERROR_ILLEGAL_ADDRESS"
	case 719:
		return "CUDA_ERROR_LAUNCH_FAILED"
	case 999:
		return "CUDA_ERROR_UNKNOWN"
	}
	return strconv.Itoa(int(r))
}

// jsonEvent is the JSON form of an event. Field names are stable: scripts
// parse them. Handles and pointers are hex strings (64-bit values do not
// survive JSON numbers); counts and sizes are numbers.
type jsonEvent struct {
	TimeNS uint64 `json:"time_ns"`
	Kind   string `json:"kind"`
	Func   string `json:"func,omitempty"`
	PID    uint32 `json:"pid"`
	TID    uint32 `json:"tid"`
	Cgroup uint64 `json:"cgroup"`
	Comm   string `json:"comm,omitempty"`

	// launch
	Function  string     `json:"function,omitempty"`
	Grid      *[3]uint32 `json:"grid,omitempty"`
	Block     *[3]uint32 `json:"block,omitempty"`
	SharedMem *uint32    `json:"shared_mem,omitempty"`
	// launch, copy
	Stream string `json:"stream,omitempty"`
	// copy
	Dir    string  `json:"dir,omitempty"`
	Bytes  *uint64 `json:"bytes,omitempty"`
	Device string  `json:"device,omitempty"`
	Host   string  `json:"host,omitempty"`
	// sync
	Handle     string  `json:"handle,omitempty"`
	Other      string  `json:"other,omitempty"`
	DurationNS *uint64 `json:"duration_ns,omitempty"`
	Result     *int32  `json:"result,omitempty"`
	ResultName string  `json:"result_name,omitempty"`
	// exec, exit
	PPID     *uint32 `json:"ppid,omitempty"`
	ExitCode *int32  `json:"exit_code,omitempty"`
	// rm_*
	FD         *int32  `json:"fd,omitempty"`
	Status     *uint32 `json:"status,omitempty"`
	Client     string  `json:"client,omitempty"`
	Parent     string  `json:"parent,omitempty"`
	Object     string  `json:"object,omitempty"`
	Class      string  `json:"class,omitempty"`
	EngineType *uint32 `json:"engine_type,omitempty"`
	Cmd        string  `json:"cmd,omitempty"`
	Value      *uint64 `json:"value,omitempty"`
}

type jsonPrinter struct{ enc *json.Encoder }

func hex(v uint64) string { return "0x" + strconv.FormatUint(v, 16) }

func (p *jsonPrinter) print(ev *trace.Event, _ uint64, comm string) error {
	j := jsonEvent{TimeNS: ev.Time, Kind: ev.Kind.String(), PID: ev.PID, TID: ev.TID, Cgroup: ev.Cgroup, Comm: comm}
	if ev.Func != trace.FuncNone {
		j.Func = ev.Func.String()
	}
	switch ev.Kind {
	case trace.KindLaunch:
		l := ev.Launch
		j.Function, j.Stream = hex(l.Function), hex(l.Stream)
		j.Grid, j.Block, j.SharedMem = &l.Grid, &l.Block, &l.SharedMem
	case trace.KindCopy:
		c := ev.Copy
		j.Dir, j.Bytes, j.Device, j.Host, j.Stream = c.Dir.String(), &c.Bytes, hex(c.Device), hex(c.Host), hex(c.Stream)
	case trace.KindSync:
		s := ev.Sync
		j.Handle, j.Other, j.DurationNS, j.Result, j.ResultName = hex(s.Handle), hex(s.Other), &s.Duration, &s.Result, cuResultName(s.Result)
	case trace.KindExec, trace.KindExit:
		pr := ev.Proc
		j.PPID, j.ExitCode = &pr.PPID, &pr.ExitCode
	case trace.KindRMAlloc, trace.KindRMFree, trace.KindRMControl:
		r := ev.RM
		j.FD, j.Status, j.Client, j.Parent, j.Object = &r.FD, &r.Status, hex(uint64(r.Client)), hex(uint64(r.Parent)), hex(uint64(r.Object))
		j.Class, j.EngineType, j.Cmd, j.Value = hex(uint64(r.Class)), &r.EngineType, hex(uint64(r.Cmd)), &r.Value
	}
	return p.enc.Encode(&j)
}

// lineWriter buffers event output and flushes it every 100 ms, so a live
// trace shows events promptly without a write per event.
type lineWriter struct {
	mu      sync.Mutex
	bw      *bufio.Writer
	err     error // the first failed flush, returned by later writes
	done    chan struct{}
	once    sync.Once
	stopErr error
	wg      sync.WaitGroup
}

func newLineWriter(w io.Writer) *lineWriter {
	lw := &lineWriter{bw: bufio.NewWriterSize(w, 64<<10), done: make(chan struct{})}
	lw.wg.Add(1)
	go func() {
		defer lw.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-lw.done:
				return
			case <-t.C:
				lw.mu.Lock()
				if err := lw.bw.Flush(); err != nil && lw.err == nil {
					lw.err = err
				}
				lw.mu.Unlock()
			}
		}
	}()
	return lw
}

func (lw *lineWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err != nil {
		return 0, lw.err
	}
	return lw.bw.Write(p)
}

// stop ends the flusher and flushes what is left; later calls return the
// first call's result.
func (lw *lineWriter) stop() error {
	lw.once.Do(func() {
		close(lw.done)
		lw.wg.Wait()
		lw.stopErr = lw.bw.Flush()
	})
	return lw.stopErr
}
