package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"

	"golang.org/x/sys/unix"
)

// EnvFilter says which environment variables Environ keeps, and bounds
// the read. The zero values of the bounds mean their defaults.
type EnvFilter struct {
	// Prefix keeps the variables whose name starts with it (such as
	// "ARBITER_"); Names keeps these exact names. A variable matching
	// neither is never copied out of the read buffer.
	Prefix string
	Names  []string
	// MaxBytes bounds how much of /proc/PID/environ is read (default
	// 256 KiB); MaxVars how many variables are kept (default 64) and
	// MaxValue the bytes of each value (default 1024; longer values are
	// cut).
	MaxBytes, MaxVars, MaxValue int
}

func (e EnvFilter) withDefaults() EnvFilter {
	if e.MaxBytes <= 0 {
		e.MaxBytes = 256 << 10
	}
	if e.MaxVars <= 0 {
		e.MaxVars = 64
	}
	if e.MaxValue <= 0 {
		e.MaxValue = 1024
	}
	return e
}

func (e *EnvFilter) allows(name []byte) bool {
	if e.Prefix != "" && bytes.HasPrefix(name, []byte(e.Prefix)) {
		return true
	}
	return slices.ContainsFunc(e.Names, func(n string) bool { return string(name) == n })
}

// envNameBytes is room kept for a variable's name beside its longest
// kept value in the read buffer.
const envNameBytes = 1024

// Environ reads the allowed variables of pid's initial environment
// (/proc/PID/environ, as the process was started; later changes are not
// visible), or nil when none is set. It streams the file through a
// small buffer: the rest of the environment, which may hold secrets, is
// never kept. Reading another user's process needs CAP_SYS_PTRACE.
func (f *FS) Environ(pid int, filter EnvFilter) (map[string]string, error) {
	o := filter.withDefaults()
	fd, err := open(f.Path(pid, "environ"))
	if err != nil {
		return nil, f.fail(pid, "environ", err)
	}
	defer unix.Close(fd)
	r := bufio.NewReaderSize(io.LimitReader(fdReader(fd), int64(o.MaxBytes)), o.MaxValue+envNameBytes)
	var env map[string]string
	for {
		kv, err := r.ReadSlice(0)
		long := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !long && err != io.EOF {
			return nil, f.fail(pid, "environ", err)
		}
		kv = bytes.TrimSuffix(kv, []byte{0})
		if k, v, ok := bytes.Cut(kv, []byte{'='}); ok && o.allows(k) {
			if len(env) == o.MaxVars {
				return env, nil
			}
			if env == nil {
				env = map[string]string{}
			}
			env[string(k)] = string(v[:min(len(v), o.MaxValue)])
		}
		for long { // skip the rest of a variable longer than the buffer
			_, err = r.ReadSlice(0)
			long = errors.Is(err, bufio.ErrBufferFull)
		}
		if err == io.EOF {
			return env, nil
		}
		if err != nil {
			return nil, f.fail(pid, "environ", err)
		}
	}
}

// fdReader reads a file descriptor with plain system calls.
type fdReader int

func (fd fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(fd), p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}
