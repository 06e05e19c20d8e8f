package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// runDemo runs scripts/demo.sh with env added and returns its exit status
// and combined output.
func runDemo(t *testing.T, env ...string) (int, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		// Not root, the demo runs the trace with sudo, which may ask for
		// a password.
		testenv.Skip(t, "the demo needs root to run without sudo")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "..", "scripts", "demo.sh"))
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("demo still running after 2 minutes:\n%s", out)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// writeScript writes an executable shell script dir/name and returns its
// path.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// testArbiter returns a script that runs this test binary as arbiter.
func testArbiter(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return writeScript(t, t.TempDir(), "arbiter", "ARBITER_TEST_MAIN=1 exec "+self+` "$@"`+"\n")
}

// TestDemoShowsWhyTheTracerFailed breaks the demo's tracer on purpose: the
// demo must print what the tracer said and exit with its status, not end
// in "0 events in all" and a bare make error.
func TestDemoShowsWhyTheTracerFailed(t *testing.T) {
	b := cudastub.ForTest(t)
	const cause = "arbiter: tracing CUDA calls needs tracefs mounted, which this system lacks: mount it (mount -t tracefs nodev /sys/kernel/tracing)"
	broken := writeScript(t, t.TempDir(), "arbiter", "echo 'arbiter trace: attached 30 probes to /x/libcuda.so.1' >&2\necho '"+cause+"' >&2\nexit 77\n")
	code, out := runDemo(t, "DURATION=1s", "ARBITER_BIN="+broken, "ARBITER_STUB="+b.Dir)
	if code != 77 {
		t.Errorf("exit status %d, want the tracer's 77", code)
	}
	if !strings.Contains(out, "demo: arbiter trace failed (exit status 77); it said:\n  arbiter trace: attached 30 probes to /x/libcuda.so.1\n  "+cause+"\n") {
		t.Errorf("the tracer's message is not shown:\n%s", out)
	}
	if strings.Contains(out, "events in all") {
		t.Errorf("an event count after a failed trace:\n%s", out)
	}
}

func TestDemoNamesWhatIsMissing(t *testing.T) {
	b := cudastub.ForTest(t)
	missing := filepath.Join(t.TempDir(), "arbiter")
	code, out := runDemo(t, "ARBITER_BIN="+missing, "ARBITER_STUB="+b.Dir)
	if code != 1 || !strings.Contains(out, "demo: "+missing+" is missing: run 'make build'") {
		t.Errorf("missing arbiter: exit %d\n%s", code, out)
	}

	// A workload that cannot start (here: it fails at once) is named
	// before anything is traced.
	stub := t.TempDir()
	for _, name := range []string{"infer", "train"} {
		writeScript(t, stub, name, "echo "+name+": cannot open libcuda.so.1 >&2\nexit 3\n")
	}
	if err := os.WriteFile(filepath.Join(stub, "libcuda.so.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = runDemo(t, "ARBITER_BIN="+testArbiter(t), "ARBITER_STUB="+stub)
	if code != 1 || !strings.Contains(out, "infer: cannot open libcuda.so.1") ||
		!strings.Contains(out, "exited at once (exit status 3)") || strings.Contains(out, "arbiter trace --duration") {
		t.Errorf("dead workloads: exit %d\n%s", code, out)
	}
}

// TestDemo runs the whole demo for 2 s with the real probes.
func TestDemo(t *testing.T) {
	testenv.Privileged(t)
	testenv.LockNodeDaemons(t)
	b := cudastub.ForTest(t)
	code, out := runDemo(t, "DURATION=2s", "ARBITER_BIN="+testArbiter(t), "ARBITER_STUB="+b.Dir)
	if code != 0 {
		t.Fatalf("demo exit status %d:\n%s", code, out)
	}
	for _, want := range []string{
		" infer           copy   cuMemcpyHtoDAsync_v2 htod bytes=1048576",
		" train           launch cuLaunchKernel",
		" events in all\n",
		"2 CUDA processes (",
		`"kind":"sync","func":"cuStreamSynchronize"`,
		"resnet-infer",
		"Under arbiter run, LC p99 is",
		" arbiter  resnet-infer  latency-critical",
		"gate      supported",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}
