// Package testenv decides whether a privileged test runs, skips or fails.
//
// Tests that need root, eBPF or a particular kernel feature call Skip rather
// than t.Skip: where ARBITER_REQUIRE_BPF is set (CI runs as root and sets
// it), a missing prerequisite fails the test instead of hiding a broken
// probe behind a skip. Tests that start an enforcing daemon also take
// LockNodeDaemons, so that no two run at once on one node.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cilium/ebpf/rlimit"
)

// RequireVar is the environment variable that turns skips into failures.
const RequireVar = "ARBITER_REQUIRE_BPF"

// Required reports whether privileged tests must run in this environment.
func Required() bool { return os.Getenv(RequireVar) != "" }

// Skip skips the test, or fails it where RequireVar is set.
func Skip(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		tb.Fatalf("%s is set but this test cannot run: %s", RequireVar, msg)
	}
	tb.Skip(msg)
}

// Privileged skips (or fails, see Skip) unless the test runs as root, and
// lifts the memlock limit that older kernels apply to eBPF maps.
func Privileged(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Skip(tb, "needs root for eBPF (run the tests as root)")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		Skip(tb, "cannot lift RLIMIT_MEMLOCK: %v", err)
	}
}

// noTracefsVar marks the re-executed test binary of MainWithoutTracefs.
const noTracefsVar = "ARBITER_TEST_NO_TRACEFS"

// MainWithoutTracefs runs a package's tests as Arbiter runs on a node where
// nobody mounted tracefs or debugfs (containers, minimal hosts): as root it
// re-executes the test binary in a new mount namespace whose mounts are all
// private (nothing reaches the host), unmounts every tracefs and debugfs
// there, and runs the tests in it. Not as root, it runs them as they are:
// the privileged tests skip, or fail through Privileged where RequireVar is
// set. Call it from TestMain: os.Exit(testenv.MainWithoutTracefs(m)).
func MainWithoutTracefs(m *testing.M) int {
	if os.Getenv(noTracefsVar) == "1" {
		if err := unmountTracefs(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
			return 1
		}
		return m.Run()
	}
	if os.Geteuid() != 0 {
		return m.Run()
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), noTracefsVar+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Go makes every mount of the new namespace private (MS_REC|MS_PRIVATE
	// on /) before it runs the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "testenv: run the tests in a mount namespace without tracefs: %v\n", err)
		return 1
	}
	return 0
}

// unmountTracefs detaches every tracefs and debugfs mount of the calling
// process's mount namespace, deepest first, and checks that none is left.
func unmountTracefs() error {
	for range 8 {
		mounts, err := TracefsMounts()
		if err != nil {
			return err
		}
		if len(mounts) == 0 {
			return nil
		}
		for i := len(mounts) - 1; i >= 0; i-- {
			if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
				return fmt.Errorf("unmount %s in the tests' mount namespace: %w", mounts[i], err)
			}
		}
	}
	return errors.New("tracefs or debugfs is still mounted in the tests' mount namespace")
}

// TracefsMounts lists the mount points of tracefs and debugfs in the
// calling thread's mount namespace, in mount order.
func TracefsMounts() ([]string, error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		// id parent major:minor root mountpoint options [optional...] - fstype ...
		before, after, ok := strings.Cut(line, " - ")
		fields, fs := strings.Fields(before), strings.Fields(after)
		if !ok || len(fields) < 5 || len(fs) == 0 {
			continue
		}
		if fs[0] == "tracefs" || fs[0] == "debugfs" {
			out = append(out, fields[4])
		}
	}
	return out, nil
}

// nodeDaemons is this test process's hold on the node-wide daemon lock:
// one descriptor per process, however many tests and subtests ask, since
// the lock belongs to the process.
var nodeDaemons struct {
	sync.Mutex
	f       *os.File
	holders int
}

// LockNodeDaemons serializes the tests that start an enforcing daemon
// (arbiter run, the demos, the installed unit, the GPU validation's
// daemon section) across the test binaries go test runs in parallel. A
// daemon attaches to every CUDA process on the node, so two at once would
// hold each other's workloads: a test could find its workload gated by
// another package's daemon. The lock is an exclusive flock on a file in
// the temporary directory, held until tb ends; nested calls in one process
// share it.
func LockNodeDaemons(tb testing.TB) {
	tb.Helper()
	nodeDaemons.Lock()
	defer nodeDaemons.Unlock()
	if nodeDaemons.holders == 0 {
		path := filepath.Join(os.TempDir(), "arbiter-node-daemons.lock")
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			tb.Fatalf("node daemon lock: %v", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			tb.Fatalf("node daemon lock %s: %v", path, err)
		}
		nodeDaemons.f = f
	}
	nodeDaemons.holders++
	tb.Cleanup(func() {
		nodeDaemons.Lock()
		defer nodeDaemons.Unlock()
		if nodeDaemons.holders--; nodeDaemons.holders == 0 {
			nodeDaemons.f.Close()
			nodeDaemons.f = nil
		}
	})
}
