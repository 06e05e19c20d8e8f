package nvrm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// A classic tracepoint is named by an id that only tracefs tells. Arbiter
// must attach on nodes where nobody mounted tracefs (containers, minimal
// hosts), and must not change the host's mounts to do it: where tracefs is
// not mounted, the ids are read from a tracefs mounted in a private mount
// namespace of one thread, which ends with the thread. Once the perf event
// is open, tracefs is no longer needed.

// attachTracepoints attaches progs[i] to the classic tracepoint
// events[i] ("group/name") through BPF perf links (kernel 5.15+), without
// needing tracefs mounted on the host. On error it attaches nothing.
func attachTracepoints(events []string, progs []*ebpf.Program) ([]link.Link, error) {
	ids, err := tracepointIDs(events...)
	if err != nil {
		return nil, err
	}
	var ls []link.Link
	for i, id := range ids {
		l, err := attachTracepointID(id, progs[i])
		if err != nil {
			for _, l := range ls {
				_ = l.Close()
			}
			return nil, fmt.Errorf("attach %s to tracepoint %s: %w", progs[i], events[i], err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// attachTracepointID links prog to the tracepoint with perf event id.
func attachTracepointID(id uint64, prog *ebpf.Program) (link.Link, error) {
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_TRACEPOINT,
		Config:      id,
		Sample_type: unix.PERF_SAMPLE_RAW,
		Sample:      1,
		Wakeup:      1,
	}
	// A tracepoint's programs run on every CPU whatever the event's CPU:
	// one event (CPU 0, every process) carries the attachment.
	fd, err := unix.PerfEventOpen(&attr, -1, 0, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("open the perf event: %w", err)
	}
	// The link holds its own reference to the event.
	defer unix.Close(fd)
	l, err := link.AttachRawLink(link.RawLinkOptions{Target: fd, Program: prog, Attach: ebpf.AttachPerfEvent})
	if err != nil {
		return nil, fmt.Errorf("create a BPF perf link (kernel 5.15+): %w", err)
	}
	return l, nil
}

// tracepointIDs returns the ids of the tracepoints named "group/name",
// read from the host's tracefs where one is mounted, else from a tracefs
// mounted privately (CAP_SYS_ADMIN).
func tracepointIDs(events ...string) ([]uint64, error) {
	// The calling thread's mounts: /proc/self is the thread-group leader's,
	// which may be a thread parked in a private namespace by an earlier
	// call (the runtime parks the main thread instead of ending it).
	if dir, ok := mountedTracefs("/proc/thread-self/mountinfo"); ok {
		return readTracepointIDs(dir, events)
	}
	type result struct {
		ids []uint64
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread is never unlocked: the runtime ends it with the
		// goroutine, and its mount namespace goes with it (the main
		// thread, which cannot end, is parked for good and never runs
		// another goroutine).
		runtime.LockOSThread()
		ids, err := privateTracefsIDs(events)
		done <- result{ids, err}
	}()
	r := <-done
	return r.ids, r.err
}

// privateTracefsIDs runs on a locked thread: it moves the thread into a
// mount namespace of its own, with every mount private so that nothing
// propagates back to the host, mounts tracefs at its usual place there and
// reads the ids.
func privateTracefsIDs(events []string) ([]uint64, error) {
	const dir = "/sys/kernel/tracing"
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return nil, fmt.Errorf("tracefs is not mounted and a private mount namespace to mount it in cannot be made (needs CAP_SYS_ADMIN; or mount tracefs at %s): %w", dir, err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("make the private mount namespace's mounts private: %w", err)
	}
	if err := unix.Mount("tracefs", dir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mount tracefs at %s in a private mount namespace (kernel built without CONFIG_TRACING?): %w", dir, err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	return readTracepointIDs(dir, events)
}

// readTracepointIDs reads events/GROUP/NAME/id under a tracefs at dir.
func readTracepointIDs(dir string, events []string) ([]uint64, error) {
	ids := make([]uint64, len(events))
	for i, ev := range events {
		path := filepath.Join(dir, "events", ev, "id")
		b, err := os.ReadFile(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("tracepoint %s does not exist (kernel built without CONFIG_FTRACE_SYSCALLS?): %w", ev, ebpf.ErrNotSupported)
			}
			return nil, fmt.Errorf("read the id of tracepoint %s: %w", ev, err)
		}
		id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: not a tracepoint id: %q", path, b)
		}
		ids[i] = id
	}
	return ids, nil
}

// mountedTracefs returns where tracefs is mounted in the caller's mount
// namespace, by mountinfo (path), or a debugfs's tracing directory.
func mountedTracefs(path string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	debugfs := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(fields) {
			continue
		}
		mnt := unescapeMountinfo(fields[4])
		switch fields[sep+1] {
		case "tracefs":
			return mnt, true
		case "debugfs":
			if debugfs == "" {
				debugfs = mnt
			}
		}
	}
	if debugfs != "" {
		if st, err := os.Stat(filepath.Join(debugfs, "tracing", "events")); err == nil && st.IsDir() {
			return filepath.Join(debugfs, "tracing"), true
		}
	}
	return "", false
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
