package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/trace"
)

// eventFilter applies --pid, --cgroup and --comm in user space (the live
// tracer applies --pid and --cgroup in the kernel too; a replay only here)
// and keeps each process's name for the output.
type eventFilter struct {
	pids    map[uint32]bool
	cgroups map[uint64]bool
	comms   map[string]bool
	// lookup names a process whose exec was not seen: /proc/PID/comm when
	// live, the file's name records in a replay; nil: names only from exec.
	lookup func(pid uint32) string
	// cacheMisses remembers failed lookups (procfs: one read per unknown
	// process, not one per event).
	// names caches each process's name: from its exec event, else procfs.
	names       map[uint32]string
	cacheMisses bool
	// matched is set once an event passed; until then missed keeps the
	// processes of the events that did not (some of them), for a replay
	// whose filters match nothing to say what the file holds.
	matched    bool
	missed     map[uint32]string
	missedMore bool // more processes than missed keeps
}

// missedMax bounds the processes eventFilter.missed keeps.
const missedMax = 16

// taskCommLen is the kernel's TASK_COMM_LEN: names are cut to 15 bytes.
const taskCommLen = 16

func newEventFilter(o *traceOptions) (*eventFilter, error) {
	f := &eventFilter{names: map[uint32]string{}}
	if len(o.pids) > 0 {
		f.pids = map[uint32]bool{}
		for _, p := range o.pids {
			f.pids[p] = true
		}
	}
	if len(o.cgroups) > 0 {
		f.cgroups = map[uint64]bool{}
		root := o.cgroupRoot
		if root == "" {
			root = "/sys/fs/cgroup"
		}
		for _, c := range o.cgroups {
			id, err := resolveCgroup(root, c)
			if err != nil {
				return nil, err
			}
			f.cgroups[id] = true
		}
	}
	if len(o.comms) > 0 {
		f.comms = map[string]bool{}
		for _, c := range o.comms {
			if c == "" {
				return nil, usageErrorf("--comm: empty process name")
			}
			// Match what the kernel keeps: the first 15 bytes.
			if len(c) > taskCommLen-1 {
				c = c[:taskCommLen-1]
			}
			f.comms[c] = true
		}
	}
	return f, nil
}

// cgroupIDs returns the --cgroup ids for the in-kernel filter.
func (f *eventFilter) cgroupIDs() []uint64 {
	var ids []uint64
	for id := range f.cgroups {
		ids = append(ids, id)
	}
	return ids
}

// match reports whether ev passes the filters and returns its process's
// name ("" if unknown). --pid and --cgroup select processes when either
// matches (as in the kernel); --comm must match as well when given.
func (f *eventFilter) match(ev *trace.Event) (string, bool) {
	name := f.name(ev)
	if ev.Kind == trace.KindExit {
		delete(f.names, ev.PID)
	}
	if (f.pids != nil || f.cgroups != nil) && !f.pids[ev.PID] && !f.cgroups[ev.Cgroup] || f.comms != nil && !f.comms[name] {
		if !f.matched {
			f.miss(ev.PID, name)
		}
		return name, false
	}
	f.matched = true
	return name, true
}

// miss notes a process whose events the filters left out, while none
// has passed them.
func (f *eventFilter) miss(pid uint32, name string) {
	if _, known := f.missed[pid]; known {
		return
	}
	if len(f.missed) == missedMax {
		f.missedMore = true
		return
	}
	if f.missed == nil {
		f.missed = map[uint32]string{}
	}
	f.missed[pid] = name
}

// unmatched says, when filters were given and no event passed them, which
// processes the events came from (some of them); "" otherwise.
func (f *eventFilter) unmatched() string {
	if f.matched || len(f.missed) == 0 {
		return ""
	}
	pids := slices.Sorted(maps.Keys(f.missed))
	parts := make([]string, len(pids))
	for i, pid := range pids {
		parts[i] = strconv.FormatUint(uint64(pid), 10)
		if n := f.missed[pid]; n != "" {
			parts[i] += " (" + printable(n) + ")"
		}
	}
	more := ""
	if f.missedMore {
		more = ", ..."
	}
	return strings.Join(parts, ", ") + more
}

// name returns the process name of ev's PID: an exec or exit event carries
// it; otherwise the cache, filled from procfs on first sight when live.
func (f *eventFilter) name(ev *trace.Event) string {
	if ev.Kind == trace.KindExec || ev.Kind == trace.KindExit {
		if c := ev.Proc.CommString(); c != "" {
			f.names[ev.PID] = c
			return c
		}
	}
	if c, ok := f.names[ev.PID]; ok {
		return c
	}
	var c string
	if f.lookup != nil {
		c = f.lookup(ev.PID)
	}
	if c != "" || f.cacheMisses {
		f.names[ev.PID] = c
	}
	return c
}

// traceComm returns a lookup of live process names in procRoot/PID/comm.
func traceComm(procRoot string) func(uint32) string {
	proc := procfs.At(procRoot)
	return func(pid uint32) string {
		comm, _ := proc.Comm(int(pid))
		return comm
	}
}

// resolveCgroup turns a --cgroup value into a cgroup v2 id: a number is
// taken as the id; a path (absolute, or relative to root) is the cgroup
// directory, whose inode number is its id.
func resolveCgroup(root, v string) (uint64, error) {
	if id, err := strconv.ParseUint(v, 10, 64); err == nil {
		if id == 0 {
			return 0, usageErrorf("--cgroup 0: not a cgroup id")
		}
		return id, nil
	}
	path := v
	if !strings.HasPrefix(path, root+"/") && path != root {
		path = filepath.Join(root, strings.TrimPrefix(v, "/"))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("--cgroup %s: %w (want a cgroup v2 directory under %s, or its id)", v, &os.PathError{Op: "stat", Path: path, Err: err}, root)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return 0, fmt.Errorf("--cgroup %s: %s is not a directory", v, path)
	}
	return st.Ino, nil
}

// tracingCaps are the capabilities live tracing needs: CAP_BPF to load the
// programs and maps, CAP_PERFMON to attach uprobes and tracepoints.
var tracingCaps = []caps.Cap{caps.BPF, caps.Perfmon}

// requireTracing returns nil when have allows live tracing, else a
// *caps.MissingError naming each missing capability (exit status 77).
func requireTracing(have caps.Set) error {
	err := caps.Check(have, "tracing CUDA calls", tracingCaps...)
	var me *caps.MissingError
	if errors.As(err, &me) {
		me.Hint = "or use --replay FILE, which needs none"
	}
	return err
}

// named reports whether the user selected ev's process by --pid or --comm
// (not only by --cgroup): such a process is shown whole, its exec and exit
// included, whether or not it makes driver calls.
func (f *eventFilter) named(ev *trace.Event, comm string) bool {
	return f.pids[ev.PID] || f.comms[comm]
}
