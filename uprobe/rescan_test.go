// Tests with real eBPF of library discovery while tracing: rescans, mount
// namespaces, exec-triggered scans and replaced library files.

package uprobe

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// TestRescanCopy checks that a copy of the library at another path, mapped
// by a process that appears after Open, is attached by the periodic rescan
// and captured; and detached once no process maps it any more.
func TestRescanCopy(t *testing.T) {
	r := newRig(t)
	dir := t.TempDir()
	copyLib(t, r.stub.Lib, filepath.Join(dir, "libcuda.so.1"))
	// Started before Open (no exec event) but shown to discovery only after
	// it, so that only the periodic rescan can find the copy.
	p := r.start(t, []string{"LD_LIBRARY_PATH=" + dir}, true, "calls", "300")
	o := r.options()
	o.RescanInterval = 100 * time.Millisecond
	tr := openTracer(t, o)
	if n := len(tr.Stats().Libraries); n != 1 {
		t.Fatalf("%d libraries before the process is shown", n)
	}
	r.expose(t, int(p.pid))
	lib := waitLibrary(t, tr, func(l Library) bool { return strings.HasPrefix(l.Path, dir) }, true)
	if len(lib.Attached) != len(trace.Funcs()) {
		t.Fatalf("copy attached %v", lib.Attached)
	}
	p.send(t, "go")
	checkCalls(t, tr, p, 300, "through the copy")
	waitLibrary(t, tr, func(l Library) bool { return strings.HasPrefix(l.Path, dir) }, false)
}

// TestMountNamespace checks a library that exists only inside another
// mount namespace: a tmpfs holding a copy of the stub, bind-mounted over
// another directory, neither visible from the tracer's namespace.
func TestMountNamespace(t *testing.T) {
	r := newRig(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatal("unshare (util-linux) is needed for this test")
	}
	o := r.options()
	o.RescanInterval = 100 * time.Millisecond
	tr := openTracer(t, o)
	store, target := t.TempDir(), t.TempDir()
	script := fmt.Sprintf(`set -e
mount -t tmpfs arbiter-test %[1]s
cp %[3]s %[1]s/libcuda.so.1
mount --bind %[1]s %[2]s
LD_LIBRARY_PATH=%[2]s exec %[4]s calls 300`, store, target, r.stub.Lib, r.exercise)
	p := startCmd(t, exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script), nil, true)
	r.expose(t, int(p.pid))
	lib := waitLibrary(t, tr, func(l Library) bool { return strings.Contains(l.Path, "/root"+target) }, true)
	if !strings.HasPrefix(lib.Path, r.procRoot) {
		t.Errorf("library path %s: want a path through the process's root", lib.Path)
	}
	if _, err := os.Stat(filepath.Join(target, "libcuda.so.1")); err == nil {
		t.Fatal("the library is visible outside the namespace: the test proves nothing")
	}
	p.send(t, "go")
	checkCalls(t, tr, p, 300, "in the namespace")
}

// TestExecAttachesSoon checks that a process's exec event makes the tracer
// look at that process at once: a library file only it maps is attached
// long before the next periodic rescan.
func TestExecAttachesSoon(t *testing.T) {
	r := newRig(t)
	o := r.options()
	o.RescanInterval = time.Hour
	tr := openTracer(t, o)
	dir := t.TempDir()
	copyLib(t, r.stub.Lib, filepath.Join(dir, "libcuda.so.1"))
	start := time.Now()
	p := r.start(t, []string{"LD_LIBRARY_PATH=" + dir}, true, "calls", "60")
	r.expose(t, int(p.pid))
	waitLibrary(t, tr, func(l Library) bool { return strings.HasPrefix(l.Path, dir) }, true)
	t.Logf("attached %v after start", time.Since(start))
	p.send(t, "go")
	checkCalls(t, tr, p, 60, "after exec")
}

// TestReplacedLibrary plays a driver upgrade: the library file is replaced
// (a new inode at the same path) while a process still runs the old one.
// Both files are probed, each process is captured, and the old file is
// detached once its last process has exited.
func TestReplacedLibrary(t *testing.T) {
	r := newRig(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "libcuda.so.1")
	copyLib(t, r.stub.Lib, path)
	oldID := statID(t, path)
	env := []string{"LD_LIBRARY_PATH=" + dir}
	oldProc := r.start(t, env, true, "calls", "60")
	r.expose(t, int(oldProc.pid))
	o := r.options()
	o.Libraries = []string{path}
	o.RescanInterval = 100 * time.Millisecond
	tr := openTracer(t, o)

	// The upgrade: a new file renamed over the old path.
	copyLib(t, r.stub.Lib, path+".new")
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	newID := statID(t, path)
	old := waitLibrary(t, tr, func(l Library) bool { return l.Inode == oldID.ino && strings.Contains(l.Path, "map_files") }, true)
	waitLibrary(t, tr, func(l Library) bool { return l.Inode == newID.ino && l.Path == path }, true)
	t.Logf("old file now attached through %s", old.Path)

	newProc := r.start(t, env, true, "calls", "60")
	r.expose(t, int(newProc.pid))
	checkers := map[uint32]*callChecker{oldProc.pid: {pid: oldProc.pid}, newProc.pid: {pid: newProc.pid}}
	oldProc.send(t, "go")
	newProc.send(t, "go")
	exits := 0
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		c, ok := checkers[ev.PID]
		switch {
		case !ok || ev.Kind == trace.KindExec:
		case ev.Kind == trace.KindExit:
			exits++
		default:
			c.check(ev)
		}
		return exits == 2
	})
	oldProc.wait(t)
	newProc.wait(t)
	for _, c := range checkers {
		if c.next != 60 || c.mismatches != 0 {
			t.Errorf("pid %d: %d calls seen, %d mismatched\n%s", c.pid, c.next, c.mismatches, strings.Join(c.first, "\n"))
		}
	}
	// No process maps the old file any more.
	waitLibrary(t, tr, func(l Library) bool { return l.Inode == oldID.ino }, false)
}

// copyLib copies a file (a new inode).
func copyLib(t testing.TB, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// waitLibrary waits until a library matching match is attached (present)
// or gone (!present).
func waitLibrary(t testing.TB, tr *Tracer, match func(Library) bool, present bool) Library {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := tr.Stats()
		for _, l := range s.Libraries {
			if match(l) {
				if l.Error != "" {
					t.Fatalf("library %s: %s", l.Path, l.Error)
				}
				if present {
					return l
				}
				goto notYet
			}
		}
		if !present {
			return Library{}
		}
	notYet:
		if time.Now().After(deadline) {
			var libs []string
			for _, l := range s.Libraries {
				libs = append(libs, fmt.Sprintf("%s (inode %d, %d attached, error %q)", l.Path, l.Inode, len(l.Attached), l.Error))
			}
			t.Fatalf("library present=%v not reached; libraries:\n%s", present, strings.Join(libs, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func statID(t *testing.T, path string) fileID {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fileID{uint64(st.Dev), st.Ino}
}
