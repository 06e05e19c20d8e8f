package nvrm

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// BenchmarkUnrelatedSyscall measures what the ioctl tracer costs the rest
// of the node: the time of a system call that is not an ioctl (getppid),
// untraced and under each attach path that attaches here, in interleaved
// rounds, each figure the fastest of several samples (other work on a
// shared machine only adds time). It reports each path's added ns per
// call and its ratio to the syscalls/sys_*_ioctl tracepoints', the cost of
// the tracer before it stopped needing tracefs: the default path must not
// exceed 1.
func BenchmarkUnrelatedSyscall(b *testing.B) {
	testenv.Privileged(b)
	const n, reps, rounds = 200_000, 5, 3
	measure := func() float64 {
		best := 0.0
		for range reps {
			start := time.Now()
			for range n {
				syscall.RawSyscall(syscall.SYS_GETPPID, 0, 0, 0)
			}
			if d := float64(time.Since(start).Nanoseconds()) / n; best == 0 || d < best {
				best = d
			}
		}
		return best
	}
	tr, err := NewTracer(nil)
	if err != nil {
		b.Fatal(err)
	}
	def := tr.AttachPath()
	if err := tr.Close(); err != nil {
		b.Fatal(err)
	}
	samples := map[AttachPath][]float64{}
	var base []float64
	b.ResetTimer()
	for range rounds {
		base = append(base, measure())
		for _, p := range attachPaths {
			tr, err := NewTracer(&TracerOptions{Attach: p.path})
			if err != nil {
				continue // a path this kernel lacks (fentry on some)
			}
			samples[p.path] = append(samples[p.path], measure())
			if err := tr.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	floor := slices.Min(base)
	tp, ok := samples[AttachSyscallTracepoint]
	if !ok {
		b.Fatal("the syscall tracepoints did not attach: no reference to compare with")
	}
	ref := slices.Min(tp) - floor
	b.ReportMetric(floor, "untraced-ns/call")
	for _, p := range attachPaths {
		if s, ok := samples[p.path]; ok {
			b.ReportMetric(slices.Min(s)-floor, string(p.path)+"-added-ns/call")
			b.ReportMetric((slices.Min(s)-floor)/ref, string(p.path)+"/tracepoint")
		}
	}
	added := slices.Min(samples[def]) - floor
	b.ReportMetric(added/ref, "default/tracepoint")
	b.Logf("default path: %s, adds %.0f ns to each unrelated system call (the syscall tracepoints: %.0f ns)", def, added, ref)
}
