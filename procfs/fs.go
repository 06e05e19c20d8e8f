package procfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// FS reads the per-process files of one procfs mount. It holds no open
// files and is safe for concurrent use.
type FS struct {
	dir string
	// hz is the kernel's clock tick (USER_HZ), the unit of start times,
	// read on first use.
	hz atomic.Uint64
}

// New returns an FS reading root/proc: root is "/" on a host, the host's
// root where it is mounted into a container, or a test's temporary tree.
func New(root string) *FS {
	return At(filepath.Join(root, "proc"))
}

// At returns an FS reading the procfs mounted at dir itself (normally
// "/proc"), for callers configured with the mount rather than the root.
func At(dir string) *FS {
	return &FS{dir: dir}
}

// Dir returns the procfs directory read.
func (f *FS) Dir() string { return f.dir }

// Path returns the path of a file of process pid, such as Path(42,
// "maps") or Path(42, "fd", "3").
func (f *FS) Path(pid int, name ...string) string {
	if len(name) == 1 {
		return f.file(pid, name[0])
	}
	return filepath.Join(append([]string{f.dir, strconv.Itoa(pid)}, name...)...)
}

// file is Path of one file name, spelled out in one allocation.
func (f *FS) file(pid int, name string) string {
	var b [128]byte
	p := append(append(b[:0], f.dir...), '/')
	p = append(strconv.AppendInt(p, int64(pid), 10), '/')
	return string(append(p, name...))
}

// PIDs returns the pids of every process procfs shows, in the order of
// the directory (ascending on Linux). Threads are not listed.
func (f *FS) PIDs() ([]int, error) {
	ents, err := os.ReadDir(f.dir)
	if err != nil {
		return nil, fmt.Errorf("list processes in %s: %w (is procfs mounted there?)", f.dir, err)
	}
	pids := make([]int, 0, len(ents))
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// ErrGone is matched (errors.Is) by the error of a read from a process
// that exited, or never existed: its /proc directory is gone (ENOENT) or
// the kernel answers that there is no such process (ESRCH).
var ErrGone = errors.New("process gone")

// Error is a failed read of one file of one process.
type Error struct {
	PID  int
	File string // the path read
	Err  error  // what the read returned; a *ParseError when the content was malformed
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("process %d: %s: %v", e.PID, e.File, e.Err)
	switch {
	case errors.Is(e, ErrGone):
		return msg + " (the process exited)"
	case errors.Is(e.Err, fs.ErrPermission):
		return msg + ": " + permissionHint(filepath.Base(e.File), e.File)
	}
	return msg
}

// Unwrap returns the underlying error: errors.Is(err, fs.ErrPermission)
// tells a denied read.
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrGone) true for a process that is gone.
func (e *Error) Is(target error) bool {
	return target == ErrGone && (errors.Is(e.Err, syscall.ENOENT) || errors.Is(e.Err, syscall.ESRCH))
}

// permissionHint names what lets a process read a file of another.
func permissionHint(name, path string) string {
	switch name {
	case "exe", "root", "cwd", "environ", "maps", "fd", "mem":
		return "reading it needs CAP_SYS_PTRACE, or running as the process's own user while it is dumpable"
	}
	if filepath.Base(filepath.Dir(path)) == "map_files" {
		return "reading it needs CAP_CHECKPOINT_RESTORE (Linux 5.9+) or CAP_SYS_ADMIN"
	}
	return "procfs is mounted with hidepid: reading another user's process needs CAP_SYS_PTRACE, or remount procfs without hidepid"
}

// ParseError is content of a /proc file that does not have the kernel's
// format.
type ParseError struct {
	What string // the field or line
	Msg  string
}

func (e *ParseError) Error() string { return e.What + ": " + e.Msg }

// fail wraps err as an *Error of pid's file name.
func (f *FS) fail(pid int, name string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the path is in Error already
	}
	return &Error{PID: pid, File: f.Path(pid, name), Err: err}
}

// read reads at most limit bytes of pid's file name, appending to buf
// (which may be a caller's stack buffer), with plain system calls:
// os.Open's poller registration costs more than a procfs read, and these
// files are read for every new process.
func (f *FS) read(pid int, name string, buf []byte, limit int) ([]byte, error) {
	fd, err := open(f.file(pid, name))
	if err != nil {
		return nil, f.fail(pid, name, err)
	}
	defer unix.Close(fd)
	buf = buf[:0]
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, min(max(cap(buf), 512), limit-len(buf)))...)[:len(buf)]
		}
		m, err := unix.Read(fd, buf[len(buf):min(cap(buf), limit)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, f.fail(pid, name, err)
		}
		if m == 0 {
			break
		}
		buf = buf[:len(buf)+m]
	}
	return buf, nil
}

func open(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}
