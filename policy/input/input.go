package input

import (
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gpu-arbiter/arbiter/procfs"
)

// Process describes one CUDA process: input.process of the classification
// input. [ReadProcess] fills it from /proc; the pod's namespace, name and
// labels come from the caller (see [Options]).
type Process struct {
	PID     int               `json:"pid"`
	PPID    int               `json:"ppid,omitempty"`
	Comm    string            `json:"comm"`
	Exe     string            `json:"exe,omitempty"`
	Cmdline []string          `json:"cmdline,omitempty"`
	UID     int               `json:"uid"`
	User    string            `json:"user,omitempty"`
	Cgroup  Cgroup            `json:"cgroup"`
	Pod     *Pod              `json:"pod,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	GPUs    []int             `json:"gpus,omitempty"`
}

// Cgroup is what a process's cgroup path says about where it runs.
type Cgroup struct {
	Path        string `json:"path,omitempty"`
	Slice       string `json:"slice,omitempty"`
	Unit        string `json:"unit,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	Runtime     string `json:"runtime,omitempty"`
	PodUID      string `json:"pod_uid,omitempty"`
	QoS         string `json:"qos,omitempty"`
}

// Pod is the Kubernetes pod a process runs in. UID comes from the cgroup
// path; the rest only when the caller resolved the UID.
type Pod struct {
	UID       string            `json:"uid"`
	Namespace string            `json:"namespace,omitempty"`
	Name      string            `json:"name,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// Options tune ReadProcess; nil means defaults.
type Options struct {
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

func (o *Options) withDefaults() Options {
	var r Options
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

// ReadProcess builds process pid's part of the classification input from
// proc. Only an unreadable stat file is an error (errors.Is(err,
// procfs.ErrGone) when the process exited); every other fact that cannot
// be read is left empty, since processes exit and hide things mid-read.
// Invalid UTF-8 in names and arguments is replaced by U+FFFD.
func ReadProcess(proc *procfs.FS, pid int, opts *Options) (Process, error) {
	o := opts.withDefaults()
	p := Process{PID: pid}
	stat, err := proc.Stat(pid)
	if err != nil {
		return p, err
	}
	p.Comm, p.PPID = stat.Comm, stat.PPID
	if comm, err := proc.Comm(pid); err == nil {
		p.Comm = comm
	}
	p.Comm = clean(p.Comm)
	if exe, err := proc.Exe(pid); err == nil {
		p.Exe = clean(exe)
	}
	if args, err := proc.Cmdline(pid, procfs.DefaultCmdlineBytes); err == nil && len(args) > 0 {
		p.Cmdline = make([]string, len(args))
		for i, a := range args {
			p.Cmdline[i] = clean(a)
		}
	}
	if st, err := proc.Status(pid); err == nil {
		if st.Has&procfs.HasUID != 0 {
			p.UID = int(st.UID[0])
		}
		p.User = lookupUser(o.Passwd, p.UID)
		if p.User == "" {
			// A container's users are in its own passwd file.
			p.User = lookupUser(proc.Root(pid, "/etc/passwd"), p.UID)
		}
	}
	if cg, err := proc.Cgroup(pid); err == nil {
		p.Cgroup = ParseCgroup(clean(cg))
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
	if env, err := proc.Environ(pid, procfs.EnvFilter{Prefix: o.EnvPrefix, MaxBytes: o.MaxEnvBytes,
		MaxVars: o.MaxEnvVars, MaxValue: o.MaxEnvValue}); err == nil && len(env) > 0 {
		p.Env = make(map[string]string, len(env))
		for k, v := range env {
			p.Env[clean(k)] = clean(v)
		}
	}
	if fds, err := proc.FDTargets(pid, o.MaxFDs); err == nil {
		p.GPUs = gpuIndexes(fds)
	}
	return p, nil
}

// clean replaces invalid UTF-8 so that the policy sees a valid string.
func clean(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// lookupUser reads the passwd file without cgo or NSS: the node's local
// users are what operators name in policies.
func lookupUser(passwd string, uid int) string {
	f, err := os.Open(passwd)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4<<20))
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

// gpuIndexes returns the indexes of the /dev/nvidiaN devices among a
// process's open files, sorted; nil when none.
func gpuIndexes(targets []string) []int {
	seen := map[int]bool{}
	for _, target := range targets {
		if rest, ok := strings.CutPrefix(target, "/dev/nvidia"); ok {
			if i, err := strconv.Atoi(rest); err == nil && i >= 0 {
				seen[i] = true
			}
		}
	}
	if len(seen) == 0 {
		return nil
	}
	gpus := make([]int, 0, len(seen))
	for i := range seen {
		gpus = append(gpus, i)
	}
	sort.Ints(gpus)
	return gpus
}
