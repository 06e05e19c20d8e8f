// Tests of the emulated GPU that processes using the stub share: time
// slicing between processes, work that runs on while its process is
// stopped, processes that die, leftovers, and GPU indexes.

package cudastub

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// lcArgs is the latency-critical workload of these tests: requests of
// eight 100 µs layers, each waited on by the host (a decoder's steps), 100
// requests/s. Alone a request takes ~0.9 ms.
var lcArgs = []string{"--rate", "100", "--launches", "8", "--kernel-us", "100", "--bytes", "65536", "--sync-every", "1"}

// beArgs is the best-effort workload: back-to-back 5 ms kernels, a sync
// every 8 (up to 40 ms queued on the GPU).
var beArgs = []string{"--kernel-us", "5000", "--sync-every", "8"}

// testNode returns a node name of the test's own, so that its processes
// share emulated GPUs only with each other and not with other tests', and
// removes the node's GPUs at the end.
func testNode(t *testing.T) string {
	t.Helper()
	name := strings.NewReplacer("/", "-", " ", "-").Replace(fmt.Sprintf("t%d-%s", os.Getpid(), t.Name()))
	if len(name) > 60 {
		name = name[:60]
	}
	t.Cleanup(func() {
		left, _ := filepath.Glob("/dev/shm/arbiter-stubgpu-" + name + "-*")
		for _, f := range left {
			os.Remove(f)
		}
	})
	return name
}

// workload is a running stub workload.
type workload struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan error
}

// start starts prog on node with env added; the test's end kills it.
func start(t *testing.T, node string, env []string, prog string, args ...string) *workload {
	t.Helper()
	w := &workload{cmd: exec.Command(prog, args...), done: make(chan error, 1)}
	w.cmd.Env = append(append(os.Environ(), "ARBITER_STUB_NODE="+node), env...)
	w.cmd.Stdout, w.cmd.Stderr = &w.stdout, &w.stderr
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.done <- w.cmd.Wait() }()
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		<-w.done
	})
	return w
}

// wait waits up to limit for the workload to exit with status 0 and
// returns its stdout.
func (w *workload) wait(t *testing.T, limit time.Duration) []byte {
	t.Helper()
	select {
	case err := <-w.done:
		w.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("%s: %v\n%s%s", filepath.Base(w.cmd.Path), err, w.stdout.String(), w.stderr.String())
		}
	case <-time.After(limit):
		t.Fatalf("%s still running after %v\n%s", filepath.Base(w.cmd.Path), limit, w.stderr.String())
	}
	return w.stdout.Bytes()
}

// stop ends a workload with SIGTERM and returns its stdout.
func (w *workload) stop(t *testing.T) []byte {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	return w.wait(t, 10*time.Second)
}

// runLC runs the LC workload for seconds on node and returns its report.
func runLC(t *testing.T, b *Build, node string, seconds int, env ...string) InferReport {
	t.Helper()
	w := start(t, node, env, b.Infer, append(lcArgs, "--duration", strconv.Itoa(seconds))...)
	r, err := ParseInferReport(w.wait(t, time.Duration(seconds+30)*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests < 20*seconds {
		t.Fatalf("LC served %d requests in %d s, want at least %d: %+v", r.Requests, seconds, 20*seconds, r)
	}
	return r
}

// stopTrain ends a BE workload and checks that it lost no work.
func stopTrain(t *testing.T, w *workload) TrainReport {
	t.Helper()
	r, err := ParseTrainReport(w.stop(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.Lost != 0 || r.Completed != r.Launches || r.Launches == 0 {
		t.Errorf("train lost work: %+v", r)
	}
	return r
}

// groupOf reads pid's group on GPU index of node.
func groupOf(t *testing.T, b *Build, node string, index, pid int) (GPUGroup, bool) {
	t.Helper()
	s, err := ReadGPU(b, node, index)
	if err != nil {
		t.Fatal(err)
	}
	return s.Group(pid)
}

// TestSharedGPUColocationInflatesLatency runs the LC workload alone, then
// beside the BE workload on the same emulated GPU: every layer of a request
// now waits for the trainer's timeslice, as on a time-sliced GPU.
func TestSharedGPUColocationInflatesLatency(t *testing.T) {
	b := ForTest(t)
	node := testNode(t)
	alone := runLC(t, b, node, 2)

	be := start(t, node, nil, b.Train, beArgs...)
	colocated := runLC(t, b, node, 2)
	tr := stopTrain(t, be)
	// Other work on the machine only slows a run down: where it spoiled
	// the exclusive baseline's tail (the co-located tail under 4× it, a
	// margin over the 3× asserted below), take the best of up to five.
	for i := 0; i < 4 && colocated.P99US < 4*alone.P99US; i++ {
		if again := runLC(t, b, node, 2); again.P99US < alone.P99US {
			alone = again
		}
	}
	t.Logf("LC alone p50 %.0f µs p99 %.0f µs; beside BE p50 %.0f µs p99 %.0f µs (%.1f× at p99); BE %.1f launches/s",
		alone.P50US, alone.P99US, colocated.P50US, colocated.P99US, colocated.P99US/alone.P99US, tr.LaunchesPerS)

	// Alone a request is 8 × ~110 µs; beside BE each of its 8 layers
	// waits for up to a 1024 µs BE timeslice, ~9 ms in all (measured
	// ratios: 6-9× at p50, 5-8× at p99). The bounds leave room for a
	// noisy alone run on a loaded machine. The p99 of a 2 s run is its
	// second-slowest request of some 200: where the machine has no CPU
	// to spare, the alone run's tail is the CPU scheduler's (4.9-5.3 ms
	// against about 1 ms), hence the retries above.
	if colocated.P50US < 4*alone.P50US {
		t.Errorf("p50 beside BE %.0f µs, want >= 4× alone (%.0f µs)", colocated.P50US, alone.P50US)
	}
	if colocated.P99US < 3*alone.P99US {
		t.Errorf("p99 beside BE %.0f µs, want >= 3× alone (%.0f µs)", colocated.P99US, alone.P99US)
	}
	// BE yields to LC only for LC's ~7% of GPU time.
	if tr.LaunchesPerS < 150 || tr.LaunchesPerS > 201 {
		t.Errorf("BE %.1f launches/s beside LC, want 150..200 (5 ms kernels)", tr.LaunchesPerS)
	}
}

// TestSharedGPUTimeslice gives the BE workload a 100 µs timeslice
// (ARBITER_STUB_TIMESLICE_US, what arbiter's timeslice level sets on a real
// GPU): LC then waits at most 100 µs per layer.
func TestSharedGPUTimeslice(t *testing.T) {
	b := ForTest(t)
	node := testNode(t)
	be := start(t, node, nil, b.Train, beArgs...)
	colocated := runLC(t, b, node, 2)
	stopTrain(t, be)
	be = start(t, node, []string{"ARBITER_STUB_TIMESLICE_US=100"}, b.Train, beArgs...)
	short := runLC(t, b, node, 2)
	stopTrain(t, be)
	t.Logf("LC p50 beside BE: %.0f µs with BE's 1024 µs timeslice, %.0f µs with 100 µs", colocated.P50US, short.P50US)
	if short.P50US*2 > colocated.P50US {
		t.Errorf("LC p50 %.0f µs beside a 100 µs BE timeslice, want under half of %.0f µs (1024 µs)", short.P50US, colocated.P50US)
	}
}

// TestSharedGPUStoppedProcessWorkDrains stops the BE workload (as the
// launch gate does): the work it queued runs on while it is stopped, LC's
// latency recovers once that has drained, and BE, continued, finds all its
// launches completed.
func TestSharedGPUStoppedProcessWorkDrains(t *testing.T) {
	b := ForTest(t)
	node := testNode(t)
	alone := runLC(t, b, node, 2)
	be := start(t, node, nil, b.Train, beArgs...)
	pid := be.cmd.Process.Pid
	time.Sleep(300 * time.Millisecond)

	var queued GPUGroup
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Stop it with work queued (it syncs every 8 launches).
		if err := be.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, pid)
		var ok bool
		if queued, ok = groupOf(t, b, node, 0, pid); !ok {
			t.Fatalf("BE pid %d has no group on the GPU", pid)
		}
		if queued.QueuedNS > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("BE never had work queued when stopped: %+v", queued)
		}
		_ = be.cmd.Process.Signal(syscall.SIGCONT)
		time.Sleep(7 * time.Millisecond)
	}

	// Nobody but this test looks at the GPU now: its schedule still runs
	// the stopped process's work to the end.
	time.Sleep(time.Duration(queued.QueuedNS) + 20*time.Millisecond)
	drained, ok := groupOf(t, b, node, 0, pid)
	if !ok || drained.QueuedNS != 0 || drained.BusyNS < queued.BusyNS+queued.QueuedNS {
		t.Fatalf("stopped BE's work did not drain: when stopped %+v, later %+v", queued, drained)
	}
	waitStopped(t, pid)

	gated := runLC(t, b, node, 2)
	t.Logf("LC alone p50 %.0f µs p99 %.0f µs; BE stopped p50 %.0f µs p99 %.0f µs", alone.P50US, alone.P99US, gated.P50US, gated.P99US)
	// Beside a running BE p50 is ~9 ms (previous test).
	if gated.P50US > 2*alone.P50US+500 {
		t.Errorf("LC p50 %.0f µs with BE stopped, want about alone's %.0f µs", gated.P50US, alone.P50US)
	}
	if err := be.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopTrain(t, be)
}

// waitStopped waits until pid is in the stopped state.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && stat[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not stopped: %s", pid, stat)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSharedGPUKilledProcessDoesNotWedge kills a process with seconds of
// work queued, mid-kernel: the GPU drops its work as a real one tears down
// a dead process's channels, and the next process runs as if alone.
func TestSharedGPUKilledProcessDoesNotWedge(t *testing.T) {
	b := ForTest(t)
	node := testNode(t)
	alone := runLC(t, b, node, 1)
	be := start(t, node, nil, b.Train, "--kernel-us", "100000", "--sync-every", "50")
	pid := be.cmd.Process.Pid
	var g GPUGroup
	for deadline := time.Now().Add(5 * time.Second); g.QueuedNS < 1e9; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("BE never queued a second of work: %+v", g)
		}
		g, _ = groupOf(t, b, node, 0, pid)
	}
	if err := be.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-be.done
	be.done <- nil

	after := runLC(t, b, node, 1)
	t.Logf("LC p50 %.0f µs alone, %.0f µs after a process died with %.1f s queued", alone.P50US, after.P50US, float64(g.QueuedNS)/1e9)
	if after.P50US > 2*alone.P50US+500 {
		t.Errorf("LC p50 %.0f µs after BE was killed, want about alone's %.0f µs: the dead process's work still runs", after.P50US, alone.P50US)
	}
	if g, ok := groupOf(t, b, node, 0, pid); ok && g.QueuedNS != 0 {
		t.Errorf("the killed process still has work queued: %+v", g)
	}
}

// TestSharedGPULeftoverSegment starts on a segment left damaged by an
// earlier run: one of another layout, and one whose creator died before
// initializing it.
func TestSharedGPULeftoverSegment(t *testing.T) {
	b := ForTest(t)
	for name, content := range map[string][]byte{
		"other layout": bytes.Repeat([]byte{0xa5}, 1<<20),
		"empty":        nil,
	} {
		t.Run(name, func(t *testing.T) {
			node := testNode(t)
			path := "/dev/shm/arbiter-stubgpu-" + node + "-0"
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			r := runLC(t, b, node, 1)
			if r.P50US > 5000 {
				t.Errorf("LC p50 %.0f µs on a replaced segment", r.P50US)
			}
			if _, err := ReadGPU(b, node, 0); err != nil {
				t.Errorf("the replaced segment does not read back: %v", err)
			}
		})
	}
}

// TestSharedGPUIndexesAreIndependent runs BE on GPU 1 and LC on GPU 0
// (CUDA_VISIBLE_DEVICES): they do not share.
func TestSharedGPUIndexesAreIndependent(t *testing.T) {
	b := ForTest(t)
	node := testNode(t)
	alone := runLC(t, b, node, 1)
	be := start(t, node, []string{"CUDA_VISIBLE_DEVICES=1"}, b.Train, beArgs...)
	time.Sleep(200 * time.Millisecond)
	apart := runLC(t, b, node, 1, "CUDA_VISIBLE_DEVICES=0")
	pid := be.cmd.Process.Pid
	if g, ok := groupOf(t, b, node, 1, pid); !ok || g.BusyNS == 0 {
		t.Errorf("BE pid %d is not busy on GPU 1: %+v", pid, g)
	}
	if _, ok := groupOf(t, b, node, 0, pid); ok {
		t.Errorf("BE pid %d, on GPU 1, has a group on GPU 0", pid)
	}
	stopTrain(t, be)
	t.Logf("LC p50 on GPU 0: %.0f µs alone, %.0f µs with BE on GPU 1", alone.P50US, apart.P50US)
	if apart.P50US > 2*alone.P50US+500 {
		t.Errorf("LC p50 %.0f µs on GPU 0 with BE on GPU 1, want about alone's %.0f µs", apart.P50US, alone.P50US)
	}
}

// TestStubEnvironmentErrors: a bad setting fails cuInit and says why.
func TestStubEnvironmentErrors(t *testing.T) {
	b := ForTest(t)
	for _, tc := range []struct{ env, want string }{
		{"ARBITER_STUB_TIMESLICE_US=0", `ARBITER_STUB_TIMESLICE_US="0": want a whole number of microseconds from 1 to 10000000`},
		{"ARBITER_STUB_TIMESLICE_US=1ms", `ARBITER_STUB_TIMESLICE_US="1ms"`},
		{"CUDA_VISIBLE_DEVICES=GPU-1234", `CUDA_VISIBLE_DEVICES="GPU-1234": want up to 16 GPU indexes from 0 to 255`},
		{"ARBITER_STUB_NODE=a/b", `ARBITER_STUB_NODE="a/b": want up to 63 letters, digits`},
	} {
		cmd := exec.Command(b.Train, "--iterations", "1")
		cmd.Env = append(os.Environ(), tc.env)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Errorf("%s: err %v, want exit status 1\n%s", tc.env, err, out)
		}
		if !strings.Contains(string(out), "libcuda.so.1 (arbiter stub driver): "+tc.want) ||
			!strings.Contains(string(out), "train: cuInit: CUDA_ERROR_INVALID_VALUE") {
			t.Errorf("%s: output %q lacks %q", tc.env, out, tc.want)
		}
	}
	// No visible GPU: there is no device 0.
	cmd := exec.Command(b.Train, "--iterations", "1")
	cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "cuDeviceGet: CUDA_ERROR_INVALID_DEVICE") {
		t.Errorf("no visible GPU: err %v\n%s", err, out)
	}
}
