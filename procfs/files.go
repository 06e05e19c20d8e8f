package procfs

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Comm reads /proc/PID/comm: the command name, without its newline.
func (f *FS) Comm(pid int) (string, error) {
	var buf [64]byte
	b, err := f.read(pid, "comm", buf[:0], len(buf))
	if err != nil {
		return "", err
	}
	return string(bytes.TrimSuffix(b, []byte{'\n'})), nil
}

// Exe reads the /proc/PID/exe link: the path of the executable as the
// process's own mount namespace names it (" (deleted)" appended when the
// file was replaced).
func (f *FS) Exe(pid int) (string, error) {
	exe, err := os.Readlink(f.Path(pid, "exe"))
	if err != nil {
		return "", f.fail(pid, "exe", err)
	}
	return exe, nil
}

// DefaultCmdlineBytes bounds what Cmdline reads unless told otherwise.
const DefaultCmdlineBytes = 128 << 10

// Cmdline reads /proc/PID/cmdline, at most limit bytes (limit <= 0:
// DefaultCmdlineBytes), split into arguments. A kernel thread has none.
func (f *FS) Cmdline(pid, limit int) ([]string, error) {
	if limit <= 0 {
		limit = DefaultCmdlineBytes
	}
	var buf [512]byte
	b, err := f.read(pid, "cmdline", buf[:0], limit)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil, nil
	}
	return strings.Split(string(b), "\x00"), nil
}

// Cgroup reads /proc/PID/cgroup and returns the path that places the
// process: the cgroup v2 one ("0::/path"), else the v1 hierarchy of the
// cpu controller, else the systemd one, else the first; "" when the file
// names none.
func (f *FS) Cgroup(pid int) (string, error) {
	var buf [1024]byte
	b, err := f.read(pid, "cgroup", buf[:0], 64<<10)
	if err != nil {
		return "", err
	}
	return CgroupPath(b), nil
}

// CgroupPath picks the path that places a process from the content of
// /proc/PID/cgroup, as Cgroup does.
func CgroupPath(b []byte) string {
	var first, cpu, systemd string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			return f[2]
		}
		if first == "" {
			first = f[2]
		}
		for c := range strings.SplitSeq(f[1], ",") {
			switch c {
			case "cpu":
				cpu = f[2]
			case "name=systemd":
				systemd = f[2]
			}
		}
	}
	switch {
	case cpu != "":
		return cpu
	case systemd != "":
		return systemd
	}
	return first
}

// Root returns path as seen from pid's root directory (/proc/PID/root),
// which reaches files inside the process's mount namespace, such as a
// container's own /etc/passwd or libraries. Opening it needs what reading
// the root link needs (CAP_SYS_PTRACE for another user's process).
func (f *FS) Root(pid int, path string) string {
	return filepath.Join(f.Path(pid, "root"), path)
}

// FDTargets returns what pid's open file descriptors point to (the
// /proc/PID/fd links), reading at most max of them (max <= 0: all).
// Descriptors closed during the scan are left out.
func (f *FS) FDTargets(pid, max int) ([]string, error) {
	dir := f.Path(pid, "fd")
	d, err := os.Open(dir)
	if err != nil {
		return nil, f.fail(pid, "fd", err)
	}
	defer d.Close()
	if max <= 0 {
		max = -1
	}
	names, err := d.Readdirnames(max)
	if err != nil && err != io.EOF {
		return nil, f.fail(pid, "fd", err)
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		if target, err := os.Readlink(filepath.Join(dir, n)); err == nil {
			out = append(out, target)
		}
	}
	return out, nil
}
