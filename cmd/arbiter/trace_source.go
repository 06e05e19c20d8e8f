package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/trace"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// stdio names standard input for --replay and standard output for --record.
const stdio = "-"

// tracingNeeds are the kernel features live tracing uses, in the order a
// failure to start is blamed on them (see caps.Diagnose).
var tracingNeeds = []caps.Feature{caps.FeatureBPF, caps.FeatureBTF, caps.FeatureRingBuf, caps.FeatureUprobes, caps.FeatureCookies}

// fileSource replays a trace file or standard input.
type fileSource struct {
	r *trace.Reader
	f *os.File // nil for standard input, which is not closed
	// limit ends the replay (io.EOF) at the first event more than this
	// past the first one: --duration in trace time; 0 for none.
	limit, first uint64
	started      bool
	// names holds the name records read so far, for the processes of the
	// events read so far: Read runs in a read-ahead goroutine, and the
	// filter names processes from the engine's (see name). copied is
	// Read's own record of what names holds.
	mu     sync.Mutex
	names  map[uint32]string
	copied map[uint32]string
}

func (s *fileSource) Read(ev *trace.Event) error {
	if err := s.r.Read(ev); err != nil {
		return err
	}
	if !s.started {
		s.started, s.first = true, ev.Time
	}
	if s.limit > 0 && ev.Time > s.first && ev.Time-s.first > s.limit {
		return io.EOF
	}
	if name, ok := s.r.Name(ev.PID); ok && s.copied[ev.PID] != name {
		if s.copied == nil {
			s.copied, s.names = map[uint32]string{}, map[uint32]string{}
		}
		s.copied[ev.PID] = name
		s.mu.Lock()
		s.names[ev.PID] = name
		s.mu.Unlock()
	}
	return nil
}

// name returns the name a name record gave pid, "" if none came yet.
func (s *fileSource) name(pid uint32) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[pid]
}

func (s *fileSource) Close() error {
	if s.f == nil {
		return nil
	}
	return s.f.Close()
}

// openReplay opens the --replay file, or standard input for "-".
func openReplay(path string, stdin io.Reader) (*fileSource, error) {
	if path == stdio {
		r, err := trace.NewReader(stdin)
		if err != nil {
			return nil, fmt.Errorf("replay from stdin: %w", err)
		}
		return &fileSource{r: r}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	r, err := trace.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("replay %s: %w", path, err)
	}
	return &fileSource{r: r, f: f}, nil
}

// checkLive refuses, before anything is loaded or attached, a live trace
// that cannot work: missing capabilities, a --pid of no running process.
func checkLive(o *traceOptions) error {
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
	for _, pid := range o.pids {
		if err := checkPID(o.proc(), pid); err != nil {
			return err
		}
	}
	return nil
}

// checkPID returns an error unless pid is a running process (a thread
// group leader: the kernel filter matches thread-group ids).
func checkPID(procRoot string, pid uint32) error {
	st, err := procfs.At(procRoot).Status(int(pid))
	if errors.Is(err, procfs.ErrGone) {
		return fmt.Errorf("--pid %d: no such process: give the id of a running process (ps -e lists them), or trace without --pid and filter by --comm", pid)
	}
	if err != nil {
		return fmt.Errorf("--pid %d: %w", pid, err)
	}
	if st.Tgid != 0 && uint32(st.Tgid) != pid {
		return fmt.Errorf("--pid %d is a thread of process %d: give the process id (--pid %d)", pid, st.Tgid, st.Tgid)
	}
	return nil
}

// attachedSource leaves out the driver calls a live tracer caught before
// every probe was attached. The probes attach one after another, and a
// request caught half-way (its launches, but not yet its copies or sync)
// would open the trace with calls that never happened alone. Process
// lifecycle events are kept: they come from tracepoints attached before
// any probe.
type attachedSource struct {
	eventSource
	// from is CLOCK_MONOTONIC when Open returned, every probe attached.
	from uint64
}

func (s *attachedSource) Read(ev *trace.Event) error {
	for {
		if err := s.eventSource.Read(ev); err != nil {
			return err
		}
		if ev.Time >= s.from || !ev.Func.Valid() { // Func: a driver call, not exec or exit
			return nil
		}
	}
}

// openLive loads and attaches the tracer. A failure that a missing kernel
// feature explains comes back as a *caps.FeatureError (exit status 77)
// naming the feature and its fix.
func openLive(o *traceOptions, filter *eventFilter) (*uprobe.Tracer, error) {
	// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; where it
	// cannot be lifted, Open's failure says so and is diagnosed below.
	_ = rlimit.RemoveMemlock()
	open := o.openTracer
	if open == nil {
		open = uprobe.Open
	}
	tracer, err := open(&uprobe.Options{Libraries: o.libs, PIDs: o.pids, Cgroups: filter.cgroupIDs()})
	if err != nil {
		err = caps.Diagnose("tracing CUDA calls", err, o.probeFeature, tracingNeeds...)
		var fe *caps.FeatureError
		if errors.As(err, &fe) {
			return nil, err
		}
		return nil, fmt.Errorf("start tracing: %w", err)
	}
	return tracer, nil
}

// recorder writes the traced events to a file or standard output.
type recorder struct {
	f    *os.File // nil when recording to standard output
	w    *trace.Writer
	path string
	// named are the processes whose name the file already holds.
	named map[uint32]bool
	// flushed is when a recording to standard output was last flushed: a
	// reader at the other end of a pipe sees events within 100 ms.
	flushed time.Time
}

// newRecorder creates the --record file, or writes to stdout for "-". It
// runs before tracing starts, so that a path that cannot be written fails
// before anything is attached.
func newRecorder(path string, stdout io.Writer, args []string) (*recorder, error) {
	host, _ := os.Hostname()
	comment := strings.Join(args, " ")
	if len(comment) > trace.MaxComment {
		comment = comment[:trace.MaxComment]
	}
	if len(host) > trace.MaxHost {
		host = host[:trace.MaxHost]
	}
	r := &recorder{path: path, named: map[uint32]bool{}}
	w := stdout
	if path == stdio {
		if isTerminal(stdout) {
			return nil, errors.New("--record -: standard output is a terminal: redirect it to a file or a pipe (arbiter trace --record - | arbiter trace --replay -)")
		}
		r.path = "to stdout"
	} else {
		f, err := os.Create(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("record: %w: create the directory %s first", err, filepath.Dir(path))
		}
		if fi, serr := os.Stat(path); err != nil && serr == nil && fi.IsDir() {
			return nil, fmt.Errorf("--record %s: a directory: give the path of a file to write (e.g. %s)", path, filepath.Join(path, "trace.arbt"))
		}
		if err != nil {
			return nil, fmt.Errorf("record: %w", err)
		}
		r.f, w = f, f
	}
	tw, err := trace.NewWriter(w, trace.Header{Created: time.Now(), Host: host, Comment: comment})
	if err != nil {
		r.abort()
		return nil, fmt.Errorf("record %s: %w", r.path, err)
	}
	r.w = tw
	return r, nil
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

// tick flushes a recording to standard output every 100 ms.
func (r *recorder) tick(now time.Time) error {
	if r.f != nil || now.Sub(r.flushed) < 100*time.Millisecond {
		return nil
	}
	r.flushed = now
	return r.w.Flush()
}

func (r *recorder) close() error {
	err := r.w.Close()
	if r.f != nil {
		if cerr := r.f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("record %s: %w", r.path, err)
	}
	return nil
}

// abort closes and removes a recording that never started.
func (r *recorder) abort() {
	if r.f != nil {
		r.f.Close()
		os.Remove(r.f.Name())
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// terminalWidth returns the width in columns of the terminal w is, 0 if
// it is not one or does not say.
func terminalWidth(w io.Writer) int {
	f, ok := w.(interface{ Fd() uintptr })
	if !ok {
		return 0
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}

// sameFile reports whether the --record path names the --replay file:
// creating it would truncate what is being read.
func sameFile(replay *fileSource, record string) bool {
	if replay.f == nil || record == stdio {
		return false
	}
	a, err1 := replay.f.Stat()
	b, err2 := os.Stat(record)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// printLibraries says what the live tracer attached, on stderr.
func printLibraries(w io.Writer, s uprobe.Stats) {
	if len(s.Libraries) == 0 {
		fmt.Fprintln(w, "arbiter trace: no libcuda found yet; rescanning every 2s (--lib PATH adds one)")
		return
	}
	for _, l := range s.Libraries {
		printLibrary(w, l)
	}
}

// printLibrary says what the tracer did with one library.
func printLibrary(w io.Writer, l uprobe.Library) {
	if l.Error != "" {
		fmt.Fprintf(w, "arbiter trace: %s: not attached: %s\n", l.Path, l.Error)
		return
	}
	fmt.Fprintf(w, "arbiter trace: attached %s to %s\n", counted(len(l.Attached), "probe", "probes"), l.Path)
}

// libraryWatch tells, on stderr, of the libraries the live tracer
// attaches after the start (a rescan finds a libcuda a new process maps),
// each once, looking about once a second: without it a trace that began
// with "no libcuda found yet" never said when capture began.
type libraryWatch struct {
	stats func() uprobe.Stats
	w     io.Writer
	told  map[string]bool
	next  time.Time
}

// newLibraryWatch prints what the tracer has attached so far and returns
// the watch for what it attaches later.
func newLibraryWatch(stats func() uprobe.Stats, w io.Writer) *libraryWatch {
	l := &libraryWatch{stats: stats, w: w, told: map[string]bool{}}
	s := stats()
	printLibraries(w, s)
	for _, lib := range s.Libraries {
		l.told[lib.Path] = true
	}
	return l
}

// check prints the libraries attached since it last looked, at most once
// a second.
func (l *libraryWatch) check(now time.Time) {
	if now.Before(l.next) {
		return
	}
	l.next = now.Add(time.Second)
	for _, lib := range l.stats().Libraries {
		if !l.told[lib.Path] {
			l.told[lib.Path] = true
			printLibrary(l.w, lib)
		}
	}
}
