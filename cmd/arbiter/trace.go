package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/trace"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// traceOptions are the flags of `arbiter trace`.
type traceOptions struct {
	format   string
	pids     []uint32
	comms    []string
	cgroups  []string
	record   string
	replay   string
	duration time.Duration
	libs     []string
	idleGap  time.Duration
	quiet    bool

	// Set by tests; empty in production.
	procRoot   string // default "/proc"
	cgroupRoot string // default "/sys/fs/cgroup"
	// haveCaps returns the effective capabilities (tests fake them).
	haveCaps func() (caps.Set, error)
	// openTracer replaces uprobe.Open.
	openTracer func(*uprobe.Options) (*uprobe.Tracer, error)
	// probeFeature replaces caps.ProbeFeature when a failure to start is
	// diagnosed.
	probeFeature func(caps.Feature) error
	// ranOn sees the engine the trace ran on, after its last event.
	ranOn func(*engine.Engine)
}

// proc returns where procfs is mounted.
func (o *traceOptions) proc() string {
	if o.procRoot == "" {
		return "/proc"
	}
	return o.procRoot
}

// eventSource is what the trace command reads: the live uprobe tracer or a
// replayed file. Close unblocks a pending Read (except on standard input).
type eventSource interface {
	Read(ev *trace.Event) error
	Close() error
}

// newTraceCmd builds `arbiter trace`.
func newTraceCmd() *cobra.Command {
	o := &traceOptions{}
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Print CUDA launches, copies and syncs of every process live, with eBPF",
		Long: `Trace prints the CUDA driver calls (kernel launches, host/device copies,
synchronizing calls with their duration and result) and the exec/exit of
CUDA processes, live from eBPF uprobes on every libcuda in use, with no
change to the applications. It needs CAP_BPF and CAP_PERFMON (or root), and
a kernel with BPF, BTF, the ring buffer and uprobes (5.15 or later): where
one is missing it names it, says how to get it and exits with status 77.

--replay reads a file written by --record instead and needs no privileges;
"--replay -" reads standard input. "--record -" writes the recording to
standard output and then prints no events there (the summary still goes to
stderr), so that traces can go through a pipe:
  sudo arbiter trace --record - | ssh host arbiter trace --replay -

Filters: --pid and --cgroup select processes (either matches; applied in the
kernel when live), --comm selects by process name (the kernel's first 15
bytes) on top of them. A process shows once it is a CUDA process: its exec
is held until its first driver call and shown then, and the exec and exit
of processes that never make one (compilers, shells) are left out, unless
--pid or --comm names the process. Events are held for 20 ms and printed in
time order (a synchronizing call, reported at its return, by the time it
was entered; one that took longer shows when it returns). A live trace
shows the driver calls entered once every probe is attached: the probes
attach one after another, and a request caught half-way would otherwise
open the trace with launches whose copies and sync were not yet probed.

Text lines show seconds since the trace started (in a replay: since the
file's first event), PID/TID, the process name, the kind, the driver
function and its arguments. JSON lines carry the same with stable field
names: time_ns (CLOCK_MONOTONIC), kind, func, pid, tid,
cgroup, comm, and per kind function/stream/grid/block/shared_mem,
dir/bytes/device/host, handle/other/duration_ns/result/result_name,
ppid/exit_code; handles and pointers are hex strings.

On exit (Ctrl-C, SIGTERM, --duration, end of a replay) it prints a summary per
CUDA process on stderr: launches, launches/s (over at least 1 s of activity,
else n/a), copies, requests seen (busy periods separated by --idle-gap), sync
time, and the tracer's drops; with --format json as one JSON object
("kind":"summary") on one line.`,
		Example: `  sudo arbiter trace
  sudo arbiter trace --comm python3 --format json --duration 30s
  sudo arbiter trace --cgroup /kubepods.slice --record /tmp/trace.arbt
  arbiter trace --replay /tmp/trace.arbt --pid 4242`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTrace(cmd.Context(), o, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), os.Args)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.format, "format", "text", "event and summary output: text or json (JSON lines, one event per line)")
	f.Var((*pidList)(&o.pids), "pid", "trace only this process `ID` (repeatable)")
	f.StringArrayVar(&o.comms, "comm", nil, "trace only processes with this name (repeatable)")
	f.StringArrayVar(&o.cgroups, "cgroup", nil, "trace only this cgroup v2, by path (absolute or under /sys/fs/cgroup) or id (repeatable)")
	f.StringVar(&o.record, "record", "", "also write the events to this trace file; - writes it to stdout and prints no events")
	f.StringVar(&o.replay, "replay", "", "read events from this trace file (- for stdin) instead of tracing live (no privileges needed)")
	f.DurationVar(&o.duration, "duration", 0, "stop after this long (live: wall time; replay: trace time); 0 = until Ctrl-C")
	f.StringArrayVar(&o.libs, "lib", nil, "extra libcuda file to attach besides those discovered (repeatable)")
	f.DurationVar(&o.idleGap, "idle-gap", trace.DefaultIdleGap, "idle time that separates two requests in the summary")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "print no events, only the summary")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		switch o.format {
		case "text", "json":
		default:
			return usageErrorf("--format %q: want text or json", o.format)
		}
		if o.duration < 0 {
			return usageErrorf("--duration %v: must not be negative", o.duration)
		}
		if o.idleGap < 0 {
			return usageErrorf("--idle-gap %v: must not be negative", o.idleGap)
		}
		if o.replay != "" && len(o.libs) > 0 {
			return usageErrorf("--lib applies to live tracing, not to --replay")
		}
		return nil
	}
	return cmd
}

// pidList is the --pid flag: process ids, one per use of the flag or
// several separated by commas. Its empty value prints as "", so that help
// shows no "(default [])".
type pidList []uint32

// String implements pflag.Value.
func (l *pidList) String() string {
	s := make([]string, len(*l))
	for i, p := range *l {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ",")
}

// Set implements pflag.Value.
func (l *pidList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		p, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil || p == 0 {
			return fmt.Errorf("%s is not a process id (a positive whole number below 2^32)", f)
		}
		*l = append(*l, uint32(p))
	}
	return nil
}

// Type implements pflag.Value.
func (l *pidList) Type() string { return "ID" }

// runTrace runs the command: it checks what it can before attaching, opens
// the source and runs it through an observing engine, whose observer prints
// and records events in time order, until the source ends or ctx,
// --duration or a signal stops it; then it prints the summary. args is the
// command line recorded in a file's header.
func runTrace(ctx context.Context, o *traceOptions, stdin io.Reader, stdout, stderr io.Writer, args []string) (err error) {
	filter, err := newEventFilter(o)
	if err != nil {
		return err
	}
	var replay *fileSource
	if o.replay != "" {
		if replay, err = openReplay(o.replay, stdin); err != nil {
			return err
		}
		replay.limit = uint64(o.duration)
		filter.lookup = replay.name
		if sameFile(replay, o.record) {
			replay.Close()
			return fmt.Errorf("--record %s is the --replay file: recording would overwrite what is being read", o.record)
		}
	} else if err := checkLive(o); err != nil {
		return err
	}

	var rec *recorder
	if o.record != "" {
		if rec, err = newRecorder(o.record, stdout, args); err != nil {
			if replay != nil {
				replay.Close()
			}
			return err
		}
		defer func() {
			if rec == nil { // aborted
				return
			}
			if cerr := rec.close(); cerr != nil && err == nil {
				err = cerr
			}
		}()
	}

	var tracer *uprobe.Tracer
	var libs *libraryWatch
	var from uint64 // live: when every probe was attached
	sink := &traceSink{rec: rec, lifecycle: newLifecycleFilter(filter.named), toStdout: o.record == stdio}
	if replay == nil {
		// Live text shows times since the trace started; taken before
		// attaching, so that no event precedes it.
		sink.first = monotonicNow()
		if tracer, err = openLive(o, filter); err != nil {
			if rec != nil {
				rec.abort()
				rec = nil
			}
			return err
		}
		filter.lookup, filter.cacheMisses = traceComm(o.proc()), true
		from = monotonicNow()
		libs = newLibraryWatch(tracer.Stats, stderr)
	}

	// A reader that goes away (`arbiter trace | head`) ends the trace
	// like Ctrl-C: with EPIPE instead of death by SIGPIPE, the probes are
	// detached, the recording closed and the summary printed.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)

	var out *lineWriter
	if !o.quiet && !sink.toStdout {
		out = newLineWriter(stdout)
		defer out.stop()
		sink.printer = newEventPrinter(o.format, out)
	}
	sum := trace.NewSummary(&trace.SummaryOptions{IdleGap: o.idleGap})

	// The engine owns the loop; it stops when the source ends, on ctx,
	// at a live --duration, or when the observer fails to write.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var src engine.Source
	failed := &failures{}
	if tracer != nil {
		failed.eventSource = &attachedSource{eventSource: tracer, from: from}
		src = engine.NewLive(failed)
		if o.duration > 0 {
			ctx, stop = context.WithTimeout(ctx, o.duration)
			defer stop()
		}
	} else {
		failed.eventSource = replay
		src = newReadAhead(failed)
	}
	obs := &traceObserver{filter: filter, sum: sum, order: newOrderBuffer(orderWindow, orderLimit), sink: sink,
		firstFromEvents: replay != nil, stop: stop, libs: libs}
	eng, err := engine.New(src, nil, &engine.Options{ControlInterval: orderTick, Observers: []engine.Observer{obs}})
	if err != nil {
		src.Close()
		return err
	}
	start := time.Now()
	runErr := eng.Run(ctx)

	// Counters first, while the tracer's maps are still open; then Close,
	// which ends the reader; what it had already read is still shown.
	wall := time.Since(start)
	var stats *uprobe.Stats
	if tracer != nil {
		s := tracer.Stats()
		stats = &s
	}
	closeErr := src.Close()
	if obs.err == nil {
		// What the reader had taken is still shown, and counted.
		if err := eng.Drain(); err != nil && runErr == nil {
			runErr = err
		}
	}
	if o.ranOn != nil {
		o.ranOn(eng)
	}
	readErr := obs.finish()
	if readErr == nil && runErr != nil {
		readErr = runErr
		if failed.err != nil {
			readErr = failed.err
		}
	}
	if out != nil {
		if err := out.stop(); err != nil && readErr == nil && !errors.Is(err, syscall.EPIPE) {
			readErr = fmt.Errorf("write events: %w", err)
		}
	}
	if who := filter.unmatched(); replay != nil && readErr == nil && who != "" && o.format != "json" {
		fmt.Fprintf(stderr, "warning: no event of the replay passed --pid, --cgroup or --comm; the file holds events of processes %s\n", who)
	}
	if err := printSummary(stderr, o.format, sum, stats, wall); err != nil && readErr == nil {
		readErr = fmt.Errorf("write summary: %w", err)
	}
	if tracer != nil && closeErr != nil && readErr == nil {
		readErr = fmt.Errorf("stop tracing: %w", closeErr)
	}
	if readErr != nil {
		switch {
		case errors.Is(readErr, errSinkClosed):
			return nil
		case replay != nil && o.replay == stdio:
			return fmt.Errorf("replay from stdin: %w", readErr)
		case replay != nil:
			return fmt.Errorf("replay %s: %w", o.replay, readErr)
		}
		return fmt.Errorf("trace: %w", readErr)
	}
	return nil
}

// errSinkClosed ends a trace whose reader went away (EPIPE on stdout).
var errSinkClosed = errors.New("output closed")

// traceSink is where ordered events go: the lifecycle filter, then the
// printer and the recorder.
type traceSink struct {
	lifecycle *lifecycleFilter
	printer   eventPrinter // nil: print nothing
	rec       *recorder    // nil: record nothing
	toStdout  bool         // the recording goes to stdout
	// first is when the trace started (a replay: its first event's time);
	// text shows times since.
	first uint64
}

// release writes the held events that are due at now.
func (s *traceSink) release(b *orderBuffer, now uint64) error {
	for {
		h, ok := b.next(now)
		if !ok {
			return nil
		}
		if err := s.write(&h.ev, h.comm); err != nil {
			return err
		}
	}
}

// drain writes every held event, oldest first.
func (s *traceSink) drain(b *orderBuffer) error {
	for {
		h, ok := b.flush()
		if !ok {
			return nil
		}
		if err := s.write(&h.ev, h.comm); err != nil {
			return err
		}
	}
}

func (s *traceSink) write(ev *trace.Event, comm string) error {
	return s.lifecycle.pass(ev, comm, s.emit)
}

func (s *traceSink) emit(ev *trace.Event, comm string) error {
	if s.printer != nil {
		if err := s.printer.print(ev, s.first, comm); err != nil {
			if errors.Is(err, syscall.EPIPE) {
				return errSinkClosed
			}
			return fmt.Errorf("write events: %w", err)
		}
	}
	if s.rec != nil {
		return s.recordErr(s.rec.write(ev, comm))
	}
	return nil
}

// recordErr words a recording failure; a closed pipe on stdout just ends
// the trace.
func (s *traceSink) recordErr(err error) error {
	switch {
	case err == nil:
		return nil
	case s.toStdout && errors.Is(err, syscall.EPIPE):
		return errSinkClosed
	}
	return fmt.Errorf("record %s: %w", s.rec.path, err)
}

// monotonicNow reads CLOCK_MONOTONIC, the clock of Event.Time.
func monotonicNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}
