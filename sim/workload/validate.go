package workload

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Bounds on spec values: beyond them a value is a mistake, not a workload.
const (
	maxGPUs        = 1024
	maxRate        = 1e6 // requests/s per LC workload
	maxDuration    = time.Hour
	maxRunDuration = 365 * 24 * time.Hour
	maxCount       = 100000
	maxBytes       = 1 << 40
	maxOpsPerReq   = 1 << 20
	defaultPending = 100000
	maxPending     = 10000000
	maxWorkloads   = 4096
	maxReplicas    = 64
	maxSpecName    = 128 // characters
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// NameFrom makes a spec's name from a file's: its base name without the
// extension, each character that does not print replaced by '_', cut to
// the longest name a spec may give.
func NameFrom(path string) string {
	base := filepath.Base(path)
	name := []rune(strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '_'
		}
		return r
	}, strings.TrimSuffix(base, filepath.Ext(base))))
	return string(name[:min(len(name), maxSpecName)])
}

func fieldErr(path, format string, args ...any) *FieldError {
	return &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// validate checks values the schema cannot: ranges, required fields,
// references. It returns the first problem found.
func (s *Spec) validate() *FieldError {
	if s.Name != "" && (utf8.RuneCountInString(s.Name) > maxSpecName || !utf8.ValidString(s.Name) ||
		strings.ContainsFunc(s.Name, func(r rune) bool { return !unicode.IsPrint(r) })) {
		return fieldErr("name", "%s: want at most %d printable characters (it heads the table and the plots)", quote(s.Name), maxSpecName)
	}
	if s.GPUs < 1 || s.GPUs > maxGPUs {
		return fieldErr("gpus", "%d GPUs: must be between 1 and %d", s.GPUs, maxGPUs)
	}
	if s.Duration < 0 || time.Duration(s.Duration) > maxRunDuration {
		return fieldErr("duration", "%v: must be between 0 and %v", time.Duration(s.Duration), maxRunDuration)
	}
	if err := s.Model.validate(); err != nil {
		return err
	}
	n := len(s.BE)
	for _, lc := range s.LC {
		n += min(max(lc.Replicas, 1), maxReplicas)
	}
	for _, r := range s.Replay {
		n += len(r.Processes)
	}
	if n == 0 {
		return fieldErr("", "no workloads: give at least one of lc, be, replay")
	}
	if n > maxWorkloads {
		return fieldErr("", "%d workloads: at most %d", n, maxWorkloads)
	}
	names := map[string]string{}
	name := func(path, v string) *FieldError {
		if !nameRE.MatchString(v) {
			return fieldErr(path, "name %s: want 1–64 letters, digits, '.', '_' or '-'", quote(v))
		}
		if prev, dup := names[v]; dup {
			return fieldErr(path, "name %s already used at %s", quote(v), prev)
		}
		names[v] = path
		return nil
	}
	gpu := func(path string, g int) *FieldError {
		if g < 0 || g >= s.GPUs {
			return fieldErr(path, "gpu %d does not exist: the node has %d (0–%d)", g, s.GPUs, s.GPUs-1)
		}
		return nil
	}
	for i := range s.LC {
		lc := &s.LC[i]
		p := fmt.Sprintf("lc[%d]", i)
		if err := name(p+".name", lc.Name); err != nil {
			return err
		}
		if err := gpu(p+".gpu", lc.GPU); err != nil {
			return err
		}
		if err := lc.SLO.validate(p + ".slo"); err != nil {
			return err
		}
		if err := lc.Arrival.validate(p + ".arrival"); err != nil {
			return err
		}
		if err := validateRequest(p+".request", lc.Request); err != nil {
			return err
		}
		if lc.Replicas < 0 || lc.Replicas > maxReplicas {
			return fieldErr(p+".replicas", "%d: must be between 1 and %d", lc.Replicas, maxReplicas)
		}
		if lc.MaxPending < 0 || lc.MaxPending > maxPending {
			return fieldErr(p+".max_pending", "%d: must be between 0 (default %d) and %d", lc.MaxPending, defaultPending, maxPending)
		}
	}
	for i := range s.BE {
		be := &s.BE[i]
		p := fmt.Sprintf("be[%d]", i)
		if err := name(p+".name", be.Name); err != nil {
			return err
		}
		if err := gpu(p+".gpu", be.GPU); err != nil {
			return err
		}
		if err := be.Kernel.validate(p+".kernel", true); err != nil {
			return err
		}
		if be.SyncEvery < 0 || be.SyncEvery > maxCount {
			return fieldErr(p+".sync_every", "%d: must be between 1 and %d", be.SyncEvery, maxCount)
		}
		if be.HostGap != nil {
			if err := be.HostGap.validate(p+".host_gap", false); err != nil {
				return err
			}
		}
	}
	for i := range s.Replay {
		r := &s.Replay[i]
		p := fmt.Sprintf("replay[%d]", i)
		if r.File == "" {
			return fieldErr(p+".file", "required: the trace file to replay")
		}
		if len(r.Processes) == 0 {
			return fieldErr(p+".processes", "required: which recorded processes to replay")
		}
		for j := range r.Processes {
			rp := &r.Processes[j]
			pp := fmt.Sprintf("%s.processes[%d]", p, j)
			if (rp.PID == 0) == (rp.Comm == "") {
				return fieldErr(pp, "give exactly one of pid and comm")
			}
			if err := name(pp+".name", rp.Name); err != nil {
				return err
			}
			if err := gpu(pp+".gpu", rp.GPU); err != nil {
				return err
			}
			if rp.Class != "lc" && rp.Class != "be" {
				return fieldErr(pp+".class", "%s: want lc or be", quote(rp.Class))
			}
			if err := rp.SLO.validate(pp + ".slo"); err != nil {
				return err
			}
			if rp.SLO != nil && rp.Class != "lc" {
				return fieldErr(pp+".slo", "only lc processes have an SLO")
			}
			if rp.RequestEnd != "" && rp.RequestEnd != "gap" && rp.RequestEnd != "sync" {
				return fieldErr(pp+".request_end", "%s: want gap or sync", quote(rp.RequestEnd))
			}
			if rp.RequestEnd != "" && rp.Class != "lc" {
				return fieldErr(pp+".request_end", "only lc processes have requests")
			}
			if rp.RequestGap < 0 || time.Duration(rp.RequestGap) > maxDuration {
				return fieldErr(pp+".request_gap", "%v: must be between 0 and %v", time.Duration(rp.RequestGap), maxDuration)
			}
		}
	}
	return nil
}

func (m *Model) validate() *FieldError {
	if m == nil {
		return nil
	}
	for _, d := range []struct {
		path string
		v    Duration
	}{{"model.timeslice", m.Timeslice}, {"model.context_switch", m.ContextSwitch}, {"model.preemption", m.Preemption},
		{"model.block_drain", m.BlockDrain}, {"model.copy_latency", m.CopyLatency}} {
		if d.v < 0 || time.Duration(d.v) > maxDuration {
			return fieldErr(d.path, "%v: must be between 0 (default) and %v", time.Duration(d.v), maxDuration)
		}
	}
	if c := m.ControlLatency; c != nil && (*c < 0 || time.Duration(*c) > maxDuration) {
		return fieldErr("model.control_latency", "%v: must be between 0 (at once) and %v", time.Duration(*c), maxDuration)
	}
	switch m.Granularity {
	case "", "instruction", "block", "kernel":
	default:
		return fieldErr("model.granularity", "%s: want instruction, block or kernel", quote(m.Granularity))
	}
	if m.SpatialSlowdown < 0 || m.SpatialSlowdown > 100 {
		return fieldErr("model.spatial_slowdown", "%v: must be between 0 and 100", m.SpatialSlowdown)
	}
	if m.CopyBandwidth != 0 && (m.CopyBandwidth < 1e6 || m.CopyBandwidth > 1e13) {
		return fieldErr("model.copy_bandwidth", "%v bytes/s: must be between 1e6 and 1e13", m.CopyBandwidth)
	}
	return nil
}

func (o *SLO) validate(path string) *FieldError {
	if o == nil {
		return nil
	}
	if o.Target <= 0 || time.Duration(o.Target) > maxDuration {
		return fieldErr(path+".target", "%v: must be positive and at most %v", time.Duration(o.Target), maxDuration)
	}
	if o.Percentile != 0 && (o.Percentile <= 0 || o.Percentile >= 100) {
		return fieldErr(path+".percentile", "%v: must be between 0 and 100, exclusive", o.Percentile)
	}
	return nil
}

func (a *Arrival) validate(path string) *FieldError {
	// Each field belongs to the processes that use it.
	for _, f := range []struct {
		name  string
		set   bool
		procs []string
	}{
		{"rate", a.Rate != 0 || a.given["rate"], []string{"poisson", "lognormal", "periodic"}},
		{"sigma", a.Sigma != 0 || a.given["sigma"], []string{"lognormal"}},
		{"min", a.Min != 0 || a.given["min"], []string{"uniform"}},
		{"max", a.Max != 0 || a.given["max"], []string{"uniform"}},
		{"times", len(a.Times) > 0 || a.given["times"], []string{"trace"}},
		{"file", a.File != "" || a.given["file"], []string{"trace"}},
		{"think", a.Think != nil || a.given["think"], []string{"closed"}},
	} {
		if f.set && !slices.Contains(f.procs, a.Process) && slices.Contains(arrivalProcesses(), a.Process) {
			return fieldErr(path+"."+f.name, "%s applies to process %s only, not %s", f.name, strings.Join(f.procs, ", "), a.Process)
		}
	}
	switch a.Process {
	case "poisson", "lognormal", "periodic":
		if a.Rate == 0 {
			return fieldErr(path+".rate", "missing or 0: process %s needs requests per second, positive, at most %g", a.Process, maxRate)
		}
		if !(a.Rate > 0) || a.Rate > maxRate || math.IsInf(a.Rate, 0) {
			return fieldErr(path+".rate", "%g requests/s: must be positive and at most %g", a.Rate, maxRate)
		}
		if a.Sigma < 0 || a.Sigma > 10 {
			return fieldErr(path+".sigma", "%v: must be between 0 (default 1) and 10", a.Sigma)
		}
	case "uniform":
		if a.Min <= 0 || a.Max <= a.Min || time.Duration(a.Max) > maxDuration {
			return fieldErr(path, "uniform needs 0 < min < max ≤ %v (min %v, max %v)", maxDuration, time.Duration(a.Min), time.Duration(a.Max))
		}
		if 2e9/float64(a.Min+a.Max) > maxRate {
			return fieldErr(path, "min %v, max %v: more than %g requests/s", time.Duration(a.Min), time.Duration(a.Max), maxRate)
		}
	case "closed":
		if a.Think != nil {
			if err := a.Think.validate(path+".think", false); err != nil {
				return err
			}
		}
	case "trace":
		switch {
		case len(a.Times) == 0 && a.File == "":
			return fieldErr(path, "process trace needs its arrivals: times (a list of offsets from the start, not empty) or file (a text file of them, one a line)")
		case len(a.Times) > 0 && a.File != "":
			return fieldErr(path, "process trace takes times or file, not both")
		}
		for i := range a.Times {
			if a.Times[i] < 0 || (i > 0 && a.Times[i] < a.Times[i-1]) {
				return fieldErr(fmt.Sprintf("%s.times[%d]", path, i), "%v: arrival offsets must be non-negative and non-decreasing",
					time.Duration(a.Times[i]))
			}
		}
	default:
		return fieldErr(path+".process", "%s: want %s", quote(a.Process), strings.Join(arrivalProcesses(), ", "))
	}
	return nil
}

// arrivalProcesses lists the arrival processes a spec may name.
func arrivalProcesses() []string {
	return []string{"poisson", "lognormal", "periodic", "uniform", "trace", "closed"}
}

func validateRequest(path string, steps []Step) *FieldError {
	if len(steps) == 0 {
		return fieldErr(path, "a request needs at least one step")
	}
	ops, gpuOps := 0, 0
	for i, st := range steps {
		p := fmt.Sprintf("%s[%d]", path, i)
		set := 0
		for _, b := range []bool{st.Copy != nil, st.Kernel != nil, st.Sync != nil, st.Host != nil} {
			if b {
				set++
			}
		}
		if set != 1 {
			return fieldErr(p, "a step is exactly one of copy, kernel, sync, host (%d given)", set)
		}
		switch {
		case st.Copy != nil:
			if st.Copy.Dir != "h2d" && st.Copy.Dir != "d2h" {
				return fieldErr(p+".copy.dir", "%s: want h2d or d2h", quote(st.Copy.Dir))
			}
			if st.Copy.Bytes == 0 || st.Copy.Bytes > maxBytes {
				return fieldErr(p+".copy.bytes", "%d: must be between 1 and %d", st.Copy.Bytes, uint64(maxBytes))
			}
			ops++
			gpuOps++
		case st.Kernel != nil:
			k := st.Kernel
			if k.Count < 0 || k.Count > maxCount {
				return fieldErr(p+".kernel.count", "%d: must be between 1 and %d", k.Count, maxCount)
			}
			if err := k.Duration.validate(p+".kernel.duration", true); err != nil {
				return err
			}
			ops += max(k.Count, 1) * 2
			gpuOps++
		case st.Host != nil:
			if err := st.Host.Duration.validate(p+".host.duration", false); err != nil {
				return err
			}
			ops++
		default:
			ops++
		}
	}
	if gpuOps == 0 {
		return fieldErr(path, "a request needs at least one copy or kernel")
	}
	if ops > maxOpsPerReq {
		return fieldErr(path, "%d operations per request: at most %d", ops, maxOpsPerReq)
	}
	return nil
}

func (d *Dist) validate(path string, positive bool) *FieldError {
	switch d.Dist {
	case "", "const", "exp", "lognormal", "uniform":
	default:
		return fieldErr(path+".dist", "%s: want const, exp, lognormal or uniform", quote(d.Dist))
	}
	for _, f := range []struct {
		name string
		v    Duration
	}{{"mean", d.Mean}, {"min", d.Min}, {"max", d.Max}} {
		switch {
		case f.v >= 0:
		case d.bare:
			return fieldErr(path, "%v: a duration must not be negative", time.Duration(f.v))
		default:
			return fieldErr(path+"."+f.name, "%v: a duration must not be negative", time.Duration(f.v))
		}
	}
	if d.Dist == "uniform" {
		if d.Mean != 0 || d.givenMean {
			return fieldErr(path+".mean", "a uniform distribution is set by min and max (its mean is (min+max)/2): drop mean")
		}
		if d.Max <= d.Min || (positive && d.Min == 0) {
			return fieldErr(path, "uniform needs 0 < min < max (min %v, max %v)", time.Duration(d.Min), time.Duration(d.Max))
		}
	} else {
		switch {
		case positive && d.Mean == 0 && d.bare:
			return fieldErr(path, "0s: a duration here must be positive")
		case positive && d.Mean == 0:
			return fieldErr(path+".mean", "required and must be positive")
		}
		if d.Max != 0 && d.Max < d.Min {
			return fieldErr(path+".max", "%v is below min %v", time.Duration(d.Max), time.Duration(d.Min))
		}
	}
	if time.Duration(max(d.Mean, d.Max)) > maxDuration {
		return fieldErr(path, "%v: at most %v", time.Duration(max(d.Mean, d.Max)), maxDuration)
	}
	if d.CV < 0 || d.CV > 10 {
		return fieldErr(path+".cv", "%v: must be between 0 and 10", d.CV)
	}
	if (d.CV != 0 || d.givenCV) && d.Dist != "lognormal" {
		return fieldErr(path+".cv", "cv applies to dist lognormal only")
	}
	return nil
}
