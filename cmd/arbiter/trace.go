package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

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
}

// eventSource is what the trace command reads: the live uprobe tracer or a
// replayed file. Close unblocks a pending Read.
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
processes, live from eBPF uprobes on every libcuda in use, with no change to
the applications. It needs CAP_BPF and CAP_PERFMON (or root).

--replay reads a file written by --record instead and needs no privileges.
Filters: --pid and --cgroup select processes (either matches; applied in the
kernel when live), --comm selects by process name (the kernel's first 15
bytes) on top of them.

Text lines show seconds since the first event, PID/TID, the process name,
the kind, the driver function and its arguments. JSON lines carry the same
with stable field names: time_ns (CLOCK_MONOTONIC), kind, func, pid, tid,
cgroup, comm, and per kind function/stream/grid/block/shared_mem,
dir/bytes/device/host, handle/other/duration_ns/result/result_name,
ppid/exit_code; handles and pointers are hex strings.

On exit (Ctrl-C, SIGTERM, --duration, end of a replay) it prints a summary per
process on stderr: launches, launches/s, copies, requests seen (busy periods
separated by --idle-gap), sync time, and the tracer's drops.`,
		Example: `  sudo arbiter trace
  sudo arbiter trace --comm python3 --format json --duration 30s
  sudo arbiter trace --cgroup /kubepods.slice --record /tmp/trace.arbt
  arbiter trace --replay /tmp/trace.arbt --pid 4242`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTrace(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr(), os.Args)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.format, "format", "text", "event output: text or json (JSON lines, one event per line)")
	f.UintSlice("pid", nil, "trace only this process id (repeatable)")
	f.StringArrayVar(&o.comms, "comm", nil, "trace only processes with this name (repeatable)")
	f.StringArrayVar(&o.cgroups, "cgroup", nil, "trace only this cgroup v2, by path (absolute or under /sys/fs/cgroup) or id (repeatable)")
	f.StringVar(&o.record, "record", "", "also write the events to this trace file")
	f.StringVar(&o.replay, "replay", "", "read events from this trace file instead of tracing live (no privileges needed)")
	f.DurationVar(&o.duration, "duration", 0, "stop after this long (live: wall time; replay: trace time); 0 = until Ctrl-C")
	f.StringArrayVar(&o.libs, "lib", nil, "extra libcuda file to attach besides those discovered (repeatable)")
	f.DurationVar(&o.idleGap, "idle-gap", trace.DefaultIdleGap, "idle time that separates two requests in the summary")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "print no events, only the summary")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		pids, err := f.GetUintSlice("pid")
		if err != nil {
			return err
		}
		for _, p := range pids {
			if p == 0 || p > 1<<32-1 {
				return fmt.Errorf("--pid %d: not a process id", p)
			}
			o.pids = append(o.pids, uint32(p))
		}
		switch o.format {
		case "text", "json":
		default:
			return fmt.Errorf("--format %q: want text or json", o.format)
		}
		if o.duration < 0 || o.idleGap < 0 {
			return errors.New("--duration and --idle-gap must not be negative")
		}
		if o.replay != "" && len(o.libs) > 0 {
			return errors.New("--lib applies to live tracing, not to --replay")
		}
		return nil
	}
	return cmd
}

// runTrace runs the command: it opens the source, prints and records events
// until the source ends or ctx, --duration or a signal stops it, then prints
// the summary. args is the command line recorded in a file's header.
func runTrace(ctx context.Context, o *traceOptions, stdout, stderr io.Writer, args []string) (err error) {
	filter, err := newEventFilter(o)
	if err != nil {
		return err
	}
	var src eventSource
	var tracer *uprobe.Tracer
	var replayFile string
	if o.replay != "" {
		f, err := os.Open(o.replay)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		r, err := trace.NewReader(f)
		if err != nil {
			f.Close()
			return fmt.Errorf("replay %s: %w", o.replay, err)
		}
		src, replayFile = &fileSource{r: r, f: f}, o.replay
		filter.lookup = func(pid uint32) string {
			name, _ := r.Name(pid)
			return name
		}
	} else {
		have := o.haveCaps
		if have == nil {
			have = caps.Effective
		}
		set, err := have()
		if err != nil {
			return err
		}
		if err := requireTracing(set); err != nil {
			return err
		}
		// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK.
		_ = rlimit.RemoveMemlock()
		tracer, err = uprobe.Open(&uprobe.Options{Libraries: o.libs, PIDs: o.pids, Cgroups: filter.cgroupIDs()})
		if err != nil {
			return fmt.Errorf("start tracing: %w", err)
		}
		src = tracer
		procRoot := o.procRoot
		if procRoot == "" {
			procRoot = "/proc"
		}
		filter.lookup, filter.cacheMisses = traceComm(procRoot), true
		printLibraries(stderr, tracer.Stats())
	}

	var rec *recorder
	if o.record != "" {
		if rec, err = newRecorder(o.record, args); err != nil {
			src.Close()
			return err
		}
		defer func() {
			if cerr := rec.close(); cerr != nil && err == nil {
				err = cerr
			}
		}()
	}

	// A reader that goes away (`arbiter trace | head`) ends the trace
	// like Ctrl-C: with EPIPE instead of death by SIGPIPE, the probes are
	// detached, the recording closed and the summary printed.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	out := newLineWriter(stdout)
	defer out.stop()
	var printer eventPrinter
	if !o.quiet {
		printer = newEventPrinter(o.format, out)
	}
	sum := trace.NewSummary(&trace.SummaryOptions{IdleGap: o.idleGap})

	// Stop the source when asked: Close unblocks Read. The tracer's
	// counters are taken first, while its maps are still open.
	var stopped atomic.Bool
	var stats atomic.Pointer[uprobe.Stats]
	var wall atomic.Int64
	var closeErr error // written by stop, read after wg.Wait and stop
	start := time.Now()
	stop := func() {
		if stopped.CompareAndSwap(false, true) {
			wall.Store(int64(time.Since(start)))
			if tracer != nil {
				s := tracer.Stats()
				stats.Store(&s)
			}
			closeErr = src.Close()
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var timeout <-chan time.Time
		if o.duration > 0 && tracer != nil {
			t := time.NewTimer(o.duration)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ctx.Done():
		case <-timeout:
		case <-done:
			return
		}
		stop()
	}()

	var ev trace.Event
	var first uint64
	var readErr error
	for n := 0; ; n++ {
		if err := src.Read(&ev); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, uprobe.ErrClosed) && !stopped.Load() {
				readErr = err
			}
			break
		}
		if n == 0 {
			first = ev.Time
		}
		if tracer == nil && o.duration > 0 && ev.Time > first && ev.Time-first > uint64(o.duration) {
			break
		}
		comm, ok := filter.match(&ev)
		if !ok {
			continue
		}
		if comm != "" {
			if p, seen := sum.Process(ev.PID); !seen || p.Comm == "" {
				sum.SetComm(ev.PID, comm)
			}
		}
		sum.Add(&ev)
		if printer != nil {
			if err := printer.print(&ev, first, comm); err != nil {
				if !errors.Is(err, syscall.EPIPE) {
					readErr = fmt.Errorf("write events: %w", err)
				}
				break
			}
		}
		if rec != nil {
			if err := rec.write(&ev, comm); err != nil {
				readErr = fmt.Errorf("record %s: %w", o.record, err)
				break
			}
		}
	}
	close(done)
	wg.Wait()
	stop()
	if err := out.stop(); err != nil && readErr == nil && !errors.Is(err, syscall.EPIPE) {
		readErr = fmt.Errorf("write events: %w", err)
	}
	printSummary(stderr, sum, stats.Load(), time.Duration(wall.Load()))
	if tracer != nil && closeErr != nil && readErr == nil {
		readErr = fmt.Errorf("stop tracing: %w", closeErr)
	}
	if readErr != nil {
		if replayFile != "" {
			return fmt.Errorf("replay %s: %w", replayFile, readErr)
		}
		return fmt.Errorf("trace: %w", readErr)
	}
	return nil
}

// fileSource replays a trace file.
type fileSource struct {
	r *trace.Reader
	f *os.File
}

func (s *fileSource) Read(ev *trace.Event) error { return s.r.Read(ev) }
func (s *fileSource) Close() error               { return s.f.Close() }

// recorder writes the traced events to a file.
type recorder struct {
	f    *os.File
	w    *trace.Writer
	path string
	// named are the processes whose name the file already holds.
	named map[uint32]bool
}

// write records ev, preceded by a name record for a process first seen
// without its exec event (it was running before the recording started),
// so that a replay can show and filter it by name.
func (r *recorder) write(ev *trace.Event, comm string) error {
	switch {
	case ev.Kind == trace.KindExec:
		r.named[ev.PID] = true
	case ev.Kind == trace.KindExit:
		delete(r.named, ev.PID)
	case comm != "" && !r.named[ev.PID]:
		if err := r.w.WriteName(ev.PID, comm); err != nil {
			return err
		}
		r.named[ev.PID] = true
	}
	return r.w.Write(ev)
}

func newRecorder(path string, args []string) (*recorder, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	host, _ := os.Hostname()
	comment := strings.Join(args, " ")
	if len(comment) > trace.MaxComment {
		comment = comment[:trace.MaxComment]
	}
	if len(host) > trace.MaxHost {
		host = host[:trace.MaxHost]
	}
	w, err := trace.NewWriter(f, trace.Header{Created: time.Now(), Host: host, Comment: comment})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("record %s: %w", path, err)
	}
	return &recorder{f: f, w: w, path: path, named: map[uint32]bool{}}, nil
}

func (r *recorder) close() error {
	err := r.w.Close()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("record %s: %w", r.path, err)
	}
	return nil
}

// printLibraries says what the live tracer attached, on stderr.
func printLibraries(w io.Writer, s uprobe.Stats) {
	if len(s.Libraries) == 0 {
		fmt.Fprintln(w, "arbiter trace: no libcuda found yet; rescanning every 2s (--lib PATH adds one)")
		return
	}
	for _, l := range s.Libraries {
		if l.Error != "" {
			fmt.Fprintf(w, "arbiter trace: %s: not attached: %s\n", l.Path, l.Error)
			continue
		}
		fmt.Fprintf(w, "arbiter trace: attached %d probes to %s\n", len(l.Attached), l.Path)
	}
}
