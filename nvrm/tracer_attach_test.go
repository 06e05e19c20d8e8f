package nvrm

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// TestTracerAttachPaths attaches the tracer by every path, in a mount
// namespace without tracefs or debugfs (TestMain), and checks that each
// path that attaches records a CUDA context's allocation sequence on the
// stand-in exactly, that the default takes the cheapest path the kernel
// offers, and that no tracefs mount is left behind in the process's
// namespace (the syscall-tracepoint path mounts one only in a private
// namespace of its own).
func TestTracerAttachPaths(t *testing.T) {
	testenv.Privileged(t)
	if m, err := testenv.TracefsMounts(); err != nil || len(m) != 0 {
		t.Fatalf("tracefs or debugfs mounted in the test's namespace: %v %v", m, err)
	}
	bin, ctl := buildStandin(t)
	attached := map[AttachPath]bool{}
	for _, p := range attachPaths {
		t.Run(string(p.path), func(t *testing.T) {
			tr, err := NewTracer(&TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY, Attach: p.path})
			if err != nil {
				if p.path == AttachFentry {
					// Trampolines are a kernel build and platform
					// property (arm64 before 6.0, some hypervisors);
					// the default path must then be the next one.
					t.Logf("fentry unavailable on this kernel: %v", err)
					return
				}
				t.Fatal(err)
			}
			defer tr.Close()
			if tr.AttachPath() != p.path {
				t.Fatalf("attached by %s, asked for %s", tr.AttachPath(), p.path)
			}
			attached[p.path] = true
			s := startStandin(t, bin, ctl)
			assertEvents(t, readEvents(t, tr, 11, s.pid), standinContext(s.pid, s.ctlFD))
			if m, err := testenv.TracefsMounts(); err != nil || len(m) != 0 {
				t.Fatalf("tracefs left mounted in the process's namespace: %v %v", m, err)
			}
		})
	}
	tr, err := NewTracer(&TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	want := AttachSyscallTracepoint
	if attached[AttachFentry] {
		want = AttachFentry
	}
	if tr.AttachPath() != want {
		t.Errorf("default attach path %s, want %s (the cheapest that attached)", tr.AttachPath(), want)
	}
}

// TestMountedTracefs reads tracefs and debugfs mounts from mountinfo
// lines, escapes included.
func TestMountedTracefs(t *testing.T) {
	for _, tc := range []struct {
		name, info, want string
		ok               bool
	}{
		{"none", "22 1 0:21 / /proc rw,nosuid - proc proc rw\n", "", false},
		{"tracefs", "22 1 0:21 / /proc rw - proc proc rw\n40 30 0:12 / /sys/kernel/tracing rw,nosuid shared:20 - tracefs tracefs rw\n", "/sys/kernel/tracing", true},
		{"escaped", "40 30 0:12 / /mnt/my\\040trace rw - tracefs none rw\n", "/mnt/my trace", true},
		{"short line", "40 30 0:12 - tracefs\n", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := t.TempDir() + "/mountinfo"
			if err := os.WriteFile(path, []byte(tc.info), 0o600); err != nil {
				t.Fatal(err)
			}
			got, ok := mountedTracefs(path)
			if got != tc.want || ok != tc.ok {
				t.Errorf("mountedTracefs = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
