package procfs

import (
	"bytes"
	"strconv"

	"golang.org/x/sys/unix"
)

// Stat is what Arbiter reads of /proc/PID/stat.
type Stat struct {
	PID int
	// Comm is the command name as the kernel keeps it (at most 15 bytes,
	// unescaped: it may hold spaces, parentheses and invalid UTF-8).
	Comm string
	// State is the one-letter state: R running, S sleeping, D disk
	// sleep, T stopped, t traced, Z zombie, X dead, I idle.
	State byte
	PPID  int
	// StartTime is when the process started, in clock ticks since boot
	// (field 22); 0 only when the line was cut before it, which the
	// kernel never does.
	StartTime uint64
}

// Key is the identity of a process: its pid and start time. A pid is
// reused after its process exits; a pid and start time are not.
type Key struct {
	PID       int
	StartTime uint64 // clock ticks since boot, as in Stat
}

// Key returns the process's identity.
func (s Stat) Key() Key { return Key{PID: s.PID, StartTime: s.StartTime} }

// statBytes bounds a stat line as read: field 22 ends within the first
// ~600 bytes even with a 64-byte comm and 20-digit fields.
const statBytes = 1024

// Stat reads /proc/PID/stat.
func (f *FS) Stat(pid int) (Stat, error) {
	var buf [statBytes]byte
	b, err := f.read(pid, "stat", buf[:0], len(buf))
	if err != nil {
		return Stat{}, err
	}
	s, err := ParseStat(b)
	if err != nil {
		return Stat{}, f.fail(pid, "stat", err)
	}
	return s, nil
}

// StartTime reads only the start time of pid (clock ticks since boot), to
// tell whether a pid still names the process seen before: it reads into
// a stack buffer and parses in place.
func (f *FS) StartTime(pid int) (uint64, error) {
	var buf [statBytes]byte
	b, err := f.read(pid, "stat", buf[:0], len(buf))
	if err != nil {
		return 0, err
	}
	_, rest, err := splitComm(b)
	if err != nil {
		return 0, f.fail(pid, "stat", err)
	}
	v, err := field(rest, 19, "starttime")
	if err != nil {
		return 0, f.fail(pid, "stat", err)
	}
	return v, nil
}

// ParseStat parses a /proc/PID/stat line. The command name (field 2) may
// hold spaces and parentheses, so the fields after it are read from the
// last ')'. The pid, command, state and parent pid are required; the start
// time is read when the line reaches it.
func ParseStat(b []byte) (Stat, error) {
	var s Stat
	comm, rest, err := splitComm(b)
	if err != nil {
		return s, err
	}
	head := bytes.TrimSpace(b[:bytes.IndexByte(b, '(')])
	pid, err := strconv.Atoi(string(head))
	if err != nil || pid <= 0 {
		return s, &ParseError{"stat pid", strconv.Quote(string(head)) + " is not a process id"}
	}
	fields := bytes.Fields(rest)
	if len(fields) < 2 {
		return s, &ParseError{"stat", strconv.Itoa(len(fields)) + " fields after comm, want at least 2"}
	}
	if st := fields[0]; len(st) != 1 || (st[0]|0x20) < 'a' || (st[0]|0x20) > 'z' {
		return s, &ParseError{"stat state", strconv.Quote(string(fields[0])) + " is not a one-letter state"}
	}
	ppid, err := strconv.Atoi(string(fields[1]))
	if err != nil || ppid < 0 {
		return s, &ParseError{"stat ppid", strconv.Quote(string(fields[1])) + " is not a process id"}
	}
	s = Stat{PID: pid, Comm: string(comm), State: fields[0][0], PPID: ppid}
	if len(fields) > 19 {
		if s.StartTime, err = field(rest, 19, "starttime"); err != nil {
			return Stat{}, err
		}
	}
	return s, nil
}

// splitComm returns the command name and what follows its closing ')'.
func splitComm(b []byte) (comm, rest []byte, err error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return nil, nil, &ParseError{"stat", "no (comm) field"}
	}
	return b[open+1 : end], b[end+1:], nil
}

// field parses the i-th (0-based) space-separated number of rest, the
// fields after comm, without allocating.
func field(rest []byte, i int, name string) (uint64, error) {
	for n := 0; ; n++ {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		if end == 0 {
			return 0, &ParseError{"stat " + name, "missing (the line has " + strconv.Itoa(n) + " fields after comm)"}
		}
		if n == i {
			v, err := strconv.ParseUint(string(rest[:end]), 10, 64)
			if err != nil {
				return 0, &ParseError{"stat " + name, strconv.Quote(string(rest[:end])) + " is not a number"}
			}
			return v, nil
		}
		rest = rest[end:]
	}
}

// ClockTick returns the unit of start times: clock ticks per second.
func (f *FS) ClockTick() uint64 {
	hz := f.hz.Load()
	if hz == 0 {
		hz = clockTick()
		f.hz.Store(hz)
	}
	return hz
}

// TicksToNS converts clock ticks since boot (a start time) to nanoseconds
// since boot, the clock of CLOCK_BOOTTIME and bpf_ktime_get_boot_ns.
func (f *FS) TicksToNS(ticks uint64) uint64 {
	hz := f.ClockTick()
	return ticks/hz*1e9 + ticks%hz*1e9/hz
}

// atClockTick is AT_CLKTCK, the auxiliary vector's entry for USER_HZ.
const atClockTick = 17

// clockTick reads USER_HZ from the auxiliary vector (AT_CLKTCK), as
// sysconf(_SC_CLK_TCK) does; 100, Linux's value on every architecture
// Arbiter runs on, when it is absent.
func clockTick() uint64 {
	if auxv, err := unix.Auxv(); err == nil {
		for _, kv := range auxv {
			if kv[0] == atClockTick && kv[1] > 0 {
				return uint64(kv[1])
			}
		}
	}
	return 100
}
