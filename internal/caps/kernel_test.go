package caps

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

func TestFeatureErrorMessage(t *testing.T) {
	cause := fmt.Errorf("create ring buffer: %w", ebpf.ErrNotSupported)
	err := error(&FeatureError{What: "tracing CUDA calls", Feature: FeatureRingBuf, Err: cause})
	want := "tracing CUDA calls needs the BPF ring buffer (kernel 5.8 or later), which this system lacks: " +
		"upgrade the kernel to 5.15 or later, the oldest Arbiter traces on (create ring buffer: not supported)"
	if err.Error() != want {
		t.Errorf("message\n got %q\nwant %q", err, want)
	}
	if !errors.Is(err, ebpf.ErrNotSupported) {
		t.Error("the cause is not reachable through errors.Is")
	}
	var ec interface{ ExitCode() int }
	if !errors.As(fmt.Errorf("start: %w", err), &ec) || ec.ExitCode() != 77 {
		t.Errorf("wrapped FeatureError does not exit 77")
	}
	noCause := &FeatureError{What: "pinning", Feature: FeatureBPFFS}
	if got := noCause.Error(); !strings.HasSuffix(got, "mount the host's /sys/fs/bpf into it") || strings.Contains(got, "kernel ") {
		t.Errorf("without cause or version: %q", got)
	}
	for f := FeatureBPF; f <= FeatureMemlock; f++ {
		if strings.HasPrefix(f.String(), "kernel feature") || f.Fix() == "" {
			t.Errorf("feature %d has no name or fix", f)
		}
	}
}

func TestDiagnose(t *testing.T) {
	notSupported := fmt.Errorf("probe: %w", ebpf.ErrNotSupported)
	missing := func(gone ...Feature) func(Feature) error {
		return func(f Feature) error {
			for _, g := range gone {
				if f == g {
					return notSupported
				}
			}
			return nil
		}
	}
	needs := []Feature{FeatureBPF, FeatureBTF, FeatureRingBuf, FeatureUprobes, FeatureCookies}
	memlock := fmt.Errorf("load CUDA probes: map create: %w (MEMLOCK may be too low, consider rlimit.RemoveMemlock)", unix.EPERM)
	tracefs := errors.New("attach tracepoint sched/sched_process_exec: neither debugfs nor tracefs are mounted")
	loadErr := fmt.Errorf("load program: %w", unix.EINVAL)
	tests := []struct {
		name  string
		err   error
		probe func(Feature) error
		want  Feature // 0: err comes back unchanged
	}{
		{"memlock by its message", memlock, missing(), FeatureMemlock},
		{"tracefs by its message", tracefs, missing(), FeatureTracefs},
		{"no bpf() blames BPF before all else", loadErr, missing(FeatureBPF, FeatureRingBuf), FeatureBPF},
		{"old kernel: the ring buffer", loadErr, missing(FeatureRingBuf, FeatureCookies), FeatureRingBuf},
		{"5.10: cookies", loadErr, missing(FeatureCookies), FeatureCookies},
		{"no BTF", fmt.Errorf("load: %w", ebpf.ErrNotSupported), missing(FeatureBTF), FeatureBTF},
		{"uprobes", loadErr, missing(FeatureUprobes), FeatureUprobes},
		{"everything present: not a feature", loadErr, missing(), 0},
		{"a probe that cannot tell blames nothing", loadErr, func(Feature) error { return unix.EPERM }, 0},
		{"a feature outside needs is not blamed", loadErr, missing(FeatureBPFFS), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Diagnose("tracing CUDA calls", tt.err, tt.probe, needs...)
			var fe *FeatureError
			if tt.want == 0 {
				if got != tt.err {
					t.Fatalf("Diagnose = %v, want the error unchanged", got)
				}
				return
			}
			if !errors.As(got, &fe) || fe.Feature != tt.want || fe.What != "tracing CUDA calls" || !errors.Is(got, tt.err) {
				t.Fatalf("Diagnose = %#v, want a FeatureError for %v wrapping the cause", got, tt.want)
			}
		})
	}
	if Diagnose("x", nil, missing(FeatureBPF), needs...) != nil {
		t.Error("Diagnose(nil) is not nil")
	}
	me := fmt.Errorf("start: %w", &MissingError{What: "x", Caps: []Cap{BPF}})
	if got := Diagnose("x", me, missing(FeatureBPF), needs...); got != me {
		t.Errorf("a missing capability was re-explained: %v", got)
	}
}

func TestKernelAtLeast(t *testing.T) {
	for _, tt := range []struct {
		release string
		want    bool
	}{
		{"5.11.0", true}, {"5.10.209-1-lts", false}, {"5.15.0-91-generic", true}, {"6.1.0", true},
		{"4.19.0", false}, {"5.4", false}, {"5.11rc1", true}, {"weird", true},
	} {
		if got := kernelAtLeast(tt.release, 5, 11); got != tt.want {
			t.Errorf("kernelAtLeast(%q, 5.11) = %v, want %v", tt.release, got, tt.want)
		}
	}
}

func TestCheckBPFFS(t *testing.T) {
	dir := t.TempDir()
	err := CheckBPFFS("pinning the gate map", dir)
	var fe *FeatureError
	if !errors.As(err, &fe) || fe.Feature != FeatureBPFFS || !errors.Is(err, ebpf.ErrNotSupported) ||
		!strings.Contains(err.Error(), "mount -t bpf bpf /sys/fs/bpf") {
		t.Fatalf("CheckBPFFS on a plain directory = %v, want a FeatureError saying how to mount bpffs", err)
	}
	testenv.Privileged(t)
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		testenv.Skip(t, "mount bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	if err := CheckBPFFS("pinning", dir); err != nil {
		t.Errorf("CheckBPFFS on a bpffs mount: %v", err)
	}
}

// TestProbeFeatureHere probes the test machine, whose kernel (5.15 or later,
// with BTF) has every feature tracing needs: a probe that reports one
// missing there is broken.
func TestProbeFeatureHere(t *testing.T) {
	testenv.Privileged(t)
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	if rel := unix.ByteSliceToString(u.Release[:]); !kernelAtLeast(rel, 5, 15) {
		testenv.Skip(t, "kernel %s is older than 5.15", rel)
	}
	for _, f := range []Feature{FeatureBPF, FeatureBTF, FeatureRingBuf, FeatureUprobes, FeatureCookies, FeatureMemlock} {
		if err := ProbeFeature(f); err != nil {
			t.Errorf("ProbeFeature(%v) = %v, want present", f, err)
		}
	}
	if err := ProbeFeature(Feature(99)); err == nil || errors.Is(err, ebpf.ErrNotSupported) {
		t.Errorf("unknown feature: %v, want an inconclusive error", err)
	}
}
