package preflight

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpu-arbiter/arbiter/gpu"
	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/sched"
)

// Status is a check's outcome.
type Status string

// Check outcomes.
const (
	// OK: what the check looks for is there.
	OK Status = "OK"
	// Warn: something works less well or less widely than it could, or a
	// check could not be made conclusively; no level is refused for it.
	Warn Status = "WARN"
	// Fail: the levels that need the check are not supported.
	Fail Status = "FAIL"
)

// Level is an enforcement level, as the policies and the planner name it.
type Level = sched.Level

// The enforcement levels. Each builds on observe: every level needs the
// CUDA calls captured.
const (
	Observe   = sched.LevelObserve
	Timeslice = sched.LevelTimeslice
	Suspend   = sched.LevelSuspend
	Gate      = sched.LevelGate
)

// Levels lists the enforcement levels, weakest first.
func Levels() []Level { return []Level{Observe, Timeslice, Suspend, Gate} }

// Check is one check's result.
type Check struct {
	// Name is the check's name, e.g. "bpf-permission".
	Name string `json:"name"`
	// Status is the outcome.
	Status Status `json:"status"`
	// Detail says what was found.
	Detail string `json:"detail"`
	// Fix says what to do; empty when Status is OK.
	Fix string `json:"fix,omitempty"`
	// NeededBy are the levels that need what the check looks for; empty
	// for a check that informs only (nvml).
	NeededBy []Level `json:"needed_by"`
}

// LevelSupport says whether the node supports an enforcement level.
type LevelSupport struct {
	Level     Level `json:"level"`
	Supported bool  `json:"supported"`
	// BlockedBy names the failed checks that refuse the level.
	BlockedBy []string `json:"blocked_by,omitempty"`
	// Warnings names the checks the level needs that warned.
	Warnings []string `json:"warnings,omitempty"`
}

// Report is the result of Run.
type Report struct {
	Checks []Check        `json:"checks"`
	Levels []LevelSupport `json:"levels"`
}

// Level returns what the report says of level l; a level it does not
// list is unsupported.
func (r *Report) Level(l Level) LevelSupport {
	i := slices.IndexFunc(r.Levels, func(s LevelSupport) bool { return s.Level == l })
	if i < 0 {
		return LevelSupport{Level: l}
	}
	return r.Levels[i]
}

// Check returns the check named name, nil if there is none.
func (r *Report) Check(name string) *Check {
	i := slices.IndexFunc(r.Checks, func(c Check) bool { return c.Name == name })
	if i < 0 {
		return nil
	}
	return &r.Checks[i]
}

// Options configure Run; nil means the defaults.
type Options struct {
	// Root is where the NVIDIA driver's files (/proc/driver/nvidia,
	// /sys/module/nvidia), the device nodes (/dev/nvidia*), the processes
	// (/proc) and the library directories are read; default "/".
	Root string
	// AllowUnverifiedDriver accepts a driver newer than the newest whose
	// layouts were verified, as arbiter's --allow-unverified-driver does:
	// the driver check then warns instead of failing.
	AllowUnverifiedDriver bool
	// OpenNVML opens the GPU inventory the nvml check reads; nil means
	// gpu.Open, which loads the node's NVML library. Tests pass one that
	// hands go-nvml's mock servers to gpu.New.
	OpenNVML gpu.Opener
}

// env is what the checks share: the options and facts read once.
type env struct {
	root            string
	allowUnverified bool
	openNVML        gpu.Opener
	// have is the process's effective capability set; capsErr says why
	// it could not be read (then have is empty).
	have    caps.Set
	capsErr error
	// binary is the executable that capabilities would be granted to.
	binary string
	// missing are the capabilities the fixes so far would grant.
	missing []caps.Cap
}

// checker is one check: its name, the levels that need it, and the test.
type checker struct {
	name     string
	neededBy []Level
	run      func(*env) result
}

// result is what a check's test found.
type result struct {
	status      Status
	detail, fix string
}

// The levels that need a check, by what the check serves.
var (
	allLevels      = []Level{Observe, Timeslice, Suspend, Gate}
	channelLevels  = []Level{Timeslice, Suspend}
	statefulLevels = []Level{Suspend, Gate}
)

// checkers returns every check, in the order they are reported: the
// kernel and BPF, then libraries, then the driver, then what enforcement
// needs besides.
func checkers() []checker {
	return []checker{
		{"kernel", allLevels, checkKernel},
		{"btf", allLevels, checkBTF},
		// memlock raises the limit, as arbiter does, before anything
		// is loaded.
		{"memlock", allLevels, checkMemlock},
		{"bpf-permission", allLevels, checkBPFPermission},
		{"perf-permission", allLevels, checkPerfPermission},
		{"ring-buffer", allLevels, checkRingBuffer},
		{"bpf-cookies", allLevels, checkCookies},
		{"uprobes", allLevels, checkUprobes},
		{"raw-tracepoints", allLevels, checkRawTracepoints},
		{"ioctl-tracer", channelLevels, checkIoctlTracer},
		{"bpffs", statefulLevels, checkBPFFS},
		{"libcuda", allLevels, checkLibcuda},
		{"nvml", nil, checkNVML},
		{"nvidia-driver", channelLevels, checkDriver},
		{"control-devices", channelLevels, checkControlDevices},
		{"client-validation", channelLevels, checkClientValidation},
		{"pidfd-getfd", channelLevels, checkPidfdGetfd},
		{"interleave-privilege", []Level{Timeslice}, checkInterleave},
		{"send-signal", []Level{Gate}, checkSendSignal},
		{"kill-privilege", []Level{Gate}, checkKill},
	}
}

// Run makes every check and works out the levels. It returns an error
// only for bad options; whatever a check meets is in its result.
func Run(opts *Options) (*Report, error) {
	e := &env{root: "/"}
	if opts != nil {
		if opts.Root != "" {
			e.root = opts.Root
		}
		e.allowUnverified = opts.AllowUnverifiedDriver
		e.openNVML = opts.OpenNVML
	}
	abs, err := filepath.Abs(e.root)
	if err != nil {
		return nil, fmt.Errorf("preflight: root %q: %w", e.root, err)
	}
	if st, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("preflight: root %q: %w", e.root, err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("preflight: root %q is not a directory", e.root)
	}
	e.root = abs
	e.have, e.capsErr = caps.Effective()
	if e.binary, err = os.Executable(); err != nil {
		e.binary = "/usr/local/bin/arbiter"
	}
	return e.report(), nil
}

// report makes every check in e and works out the levels.
func (e *env) report() *Report {
	r := &Report{}
	for _, c := range checkers() {
		res := c.run(e)
		if res.status == OK {
			res.fix = ""
		}
		// NeededBy is never nil, so that JSON has [] for a check no
		// level needs, as the schema says.
		r.Checks = append(r.Checks, Check{Name: c.name, Status: res.status, Detail: res.detail, Fix: res.fix, NeededBy: append([]Level{}, c.neededBy...)})
	}
	slices.Sort(e.missing)
	for i := range r.Checks {
		r.Checks[i].Fix = strings.ReplaceAll(r.Checks[i].Fix, setcapMarker, e.setcapCommand(e.missing))
	}
	r.Levels = levelSupport(r.Checks)
	return r
}

// levelSupport works out each level from the checks that name it.
func levelSupport(checks []Check) []LevelSupport {
	var out []LevelSupport
	for _, l := range Levels() {
		s := LevelSupport{Level: l, Supported: true}
		for _, c := range checks {
			if !slices.Contains(c.NeededBy, l) {
				continue
			}
			switch c.Status {
			case Fail:
				s.Supported = false
				s.BlockedBy = append(s.BlockedBy, c.Name)
			case Warn:
				s.Warnings = append(s.Warnings, c.Name)
			}
		}
		out = append(out, s)
	}
	return out
}

// path returns p (absolute) under the root.
func (e *env) path(p string) string { return filepath.Join(e.root, p) }
