package policy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ProcOptions tune ProcessFromProc; nil means defaults.
type ProcOptions struct {
	// Passwd is the passwd file that names uids; default /etc/passwd. A
	// uid it does not name is looked up in the process's own root
	// (/proc/PID/root/etc/passwd, a container's users); else the name is
	// left empty.
	Passwd string
	// EnvPrefix selects the environment variables passed to the policy;
	// default "ARBITER_". Others are never read into the input.
	EnvPrefix string
	// MaxEnvBytes bounds how much of /proc/PID/environ is read (default
	// 256 KiB); MaxEnvVars how many variables are kept (default 64) and
	// MaxEnvValue the length of each value (default 1024 bytes).
	MaxEnvBytes, MaxEnvVars, MaxEnvValue int
	// MaxFDs bounds the file descriptors scanned for GPU device nodes
	// (default 65536).
	MaxFDs int
	// Pod resolves a pod UID (from the cgroup path) to its namespace, name
	// and labels. The daemon fills it from the kubelet's pod list; nil
	// leaves only the UID.
	Pod func(uid string) (Pod, bool)
}

func (o *ProcOptions) withDefaults() ProcOptions {
	var r ProcOptions
	if o != nil {
		r = *o
	}
	if r.Passwd == "" {
		r.Passwd = "/etc/passwd"
	}
	if r.EnvPrefix == "" {
		r.EnvPrefix = "ARBITER_"
	}
	if r.MaxEnvBytes <= 0 {
		r.MaxEnvBytes = 256 << 10
	}
	if r.MaxEnvVars <= 0 {
		r.MaxEnvVars = 64
	}
	if r.MaxEnvValue <= 0 {
		r.MaxEnvValue = 1024
	}
	if r.MaxFDs <= 0 {
		r.MaxFDs = 65536
	}
	return r
}

// ProcessFromProc builds a process's policy input from procRoot (normally
// /proc). Only a missing or unreadable stat file is an error (the process
// is gone); every other fact that cannot be read is left empty, since
// processes exit and hide things mid-read. Invalid UTF-8 in names and
// arguments is replaced by U+FFFD.
func ProcessFromProc(procRoot string, pid int, opts *ProcOptions) (Process, error) {
	o := opts.withDefaults()
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	p := Process{PID: pid}
	stat, err := readLimited(filepath.Join(dir, "stat"), 4096)
	if err != nil {
		return p, fmt.Errorf("process %d: %w", pid, err)
	}
	if p.Comm, p.PPID, err = parseStat(stat); err != nil {
		return p, fmt.Errorf("process %d: %s: %w", pid, filepath.Join(dir, "stat"), err)
	}
	if b, err := readLimited(filepath.Join(dir, "comm"), 64); err == nil {
		p.Comm = strings.TrimSuffix(string(b), "\n")
	}
	p.Comm = clean(p.Comm)
	if exe, err := os.Readlink(filepath.Join(dir, "exe")); err == nil {
		p.Exe = clean(exe)
	}
	if b, err := readLimited(filepath.Join(dir, "cmdline"), 128<<10); err == nil {
		p.Cmdline = splitNUL(b, 0)
	}
	if b, err := readLimited(filepath.Join(dir, "status"), 64<<10); err == nil {
		p.UID = parseUID(b)
		p.User = lookupUser(o.Passwd, p.UID)
		if p.User == "" {
			// A container's users are in its own passwd file.
			p.User = lookupUser(filepath.Join(dir, "root", "etc", "passwd"), p.UID)
		}
	}
	if b, err := readLimited(filepath.Join(dir, "cgroup"), 64<<10); err == nil {
		p.Cgroup = ParseCgroup(clean(cgroupPath(b)))
	}
	if p.Cgroup.PodUID != "" {
		p.Pod = &Pod{UID: p.Cgroup.PodUID}
		if o.Pod != nil {
			if pod, ok := o.Pod(p.Cgroup.PodUID); ok {
				pod.UID = p.Cgroup.PodUID
				p.Pod = &pod
			}
		}
	}
	if b, err := readLimited(filepath.Join(dir, "environ"), int64(o.MaxEnvBytes)); err == nil {
		p.Env = allowedEnv(b, o)
	}
	p.GPUs = gpuFDs(filepath.Join(dir, "fd"), o.MaxFDs)
	return p, nil
}

func readLimited(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// clean replaces invalid UTF-8 so that the policy sees a valid string.
func clean(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// parseStat reads comm and ppid from /proc/PID/stat. comm is between the
// first '(' and the last ')', and may itself hold spaces and parentheses.
func parseStat(b []byte) (string, int, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, errors.New("no (comm) field")
	}
	fields := strings.Fields(string(b[end+1:]))
	if len(fields) < 2 {
		return "", 0, fmt.Errorf("%d fields after comm, want at least 2", len(fields))
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return "", 0, fmt.Errorf("ppid %q: %w", fields[1], err)
	}
	return string(b[open+1 : end]), ppid, nil
}

func splitNUL(b []byte, max int) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	parts := bytes.Split(b, []byte{0})
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		if max > 0 && len(out) == max {
			break
		}
		out = append(out, clean(string(p)))
	}
	return out
}

func parseUID(status []byte) int {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if uid, err := strconv.Atoi(f[0]); err == nil && uid >= 0 {
					return uid
				}
			}
		}
	}
	return 0
}

// lookupUser reads the passwd file without cgo or NSS: the node's local
// users are what operators name in policies.
func lookupUser(passwd string, uid int) string {
	b, err := readLimited(passwd, 4<<20)
	if err != nil {
		return ""
	}
	want := strconv.Itoa(uid)
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 && f[2] == want {
			return clean(f[0])
		}
	}
	return ""
}

// cgroupPath picks the cgroup v2 path ("0::/path"), else the v1 hierarchy
// that names cpu, else the systemd one, else the first.
func cgroupPath(b []byte) string {
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

func allowedEnv(b []byte, o ProcOptions) map[string]string {
	env := map[string]string{}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte{'='})
		if !ok || !bytes.HasPrefix(k, []byte(o.EnvPrefix)) {
			continue
		}
		if len(env) == o.MaxEnvVars {
			break
		}
		if len(v) > o.MaxEnvValue {
			v = v[:o.MaxEnvValue]
		}
		env[clean(string(k))] = clean(string(v))
	}
	if len(env) == 0 {
		return nil
	}
	return env
}

// gpuFDs returns the indexes of the /dev/nvidiaN devices a process has open.
func gpuFDs(fdDir string, maxFDs int) []int {
	d, err := os.Open(fdDir)
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(maxFDs)
	seen := map[int]bool{}
	for _, n := range names {
		target, err := os.Readlink(filepath.Join(fdDir, n))
		if err != nil {
			continue
		}
		if rest, ok := strings.CutPrefix(target, "/dev/nvidia"); ok {
			if i, err := strconv.Atoi(rest); err == nil && i >= 0 {
				seen[i] = true
			}
		}
	}
	gpus := make([]int, 0, len(seen))
	for i := range seen {
		gpus = append(gpus, i)
	}
	sort.Ints(gpus)
	if len(gpus) == 0 {
		return nil
	}
	return gpus
}
