package preflight

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/nvrm"
)

// TestLevelSupport checks that a failed check refuses exactly the levels
// that name it, a warning refuses none, and both are listed.
func TestLevelSupport(t *testing.T) {
	got := levelSupport([]Check{
		{Name: "a", Status: OK, NeededBy: allLevels},
		{Name: "driver", Status: Fail, NeededBy: channelLevels},
		{Name: "nice", Status: Warn, NeededBy: []Level{Timeslice}},
		{Name: "kill", Status: Fail, NeededBy: []Level{Gate}},
		{Name: "nvml", Status: Fail},
	})
	want := []LevelSupport{
		{Level: Observe, Supported: true},
		{Level: Timeslice, BlockedBy: []string{"driver"}, Warnings: []string{"nice"}},
		{Level: Suspend, BlockedBy: []string{"driver"}},
		{Level: Gate, BlockedBy: []string{"kill"}},
	}
	if len(got) != len(want) {
		t.Fatalf("%+v", got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Level != w.Level || g.Supported != w.Supported || !slices.Equal(g.BlockedBy, w.BlockedBy) || !slices.Equal(g.Warnings, w.Warnings) {
			t.Errorf("level %d: %+v, want %+v", i, g, w)
		}
	}
	r := &Report{Levels: got}
	if !r.Level(Observe).Supported || r.Level(Gate).Supported || r.Level(Level(9)).Supported {
		t.Errorf("Level: %+v", r.Levels)
	}
}

func TestParseRelease(t *testing.T) {
	for _, tc := range []struct {
		rel      string
		maj, min int
		ok       bool
	}{
		{"6.18.44-fc-v657", 6, 18, true},
		{"5.15.0-91-generic", 5, 15, true},
		{"5.4rc1", 5, 4, true},
		{"4.18.0-513.el8.x86_64", 4, 18, true},
		{"weird", 0, 0, false},
		{"x.y", 0, 0, false},
	} {
		maj, min, ok := parseRelease(tc.rel)
		if maj != tc.maj || min != tc.min || ok != tc.ok {
			t.Errorf("%q: %d.%d %v, want %d.%d %v", tc.rel, maj, min, ok, tc.maj, tc.min, tc.ok)
		}
	}
}

// TestEntryOffset checks the entry point's file offset against the bytes
// there: the test binary's entry starts with the same bytes in the file
// as in this process's memory at the entry address.
func TestEntryOffset(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	off, err := entryOffset(self)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(self)
	if err != nil {
		t.Fatal(err)
	}
	if off == 0 || off >= uint64(st.Size()) {
		t.Errorf("entry offset %#x outside the %d-byte file", off, st.Size())
	}
	if _, err := entryOffset(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Error("no error for an absent file")
	}
}

// TestControlDevicesMissing checks the failure where the control device
// does not exist, and that GPU nodes are listed in numeric order.
func TestControlDevicesMissing(t *testing.T) {
	e := &env{root: t.TempDir()}
	r := checkControlDevices(e)
	if r.status != Fail || !strings.HasSuffix(r.detail, "nvidiactl: no such file or directory") || !strings.Contains(r.fix, "mknod -m 666 /dev/nvidiactl c 195 255") {
		t.Errorf("%+v", r)
	}
	if got := gpuNodes(filepath.Join(e.root, "dev")); len(got) != 0 {
		t.Errorf("gpuNodes of an absent dir: %v", got)
	}
}

func TestSameVersion(t *testing.T) {
	v := nvrm.DriverVersion{Major: 550, Minor: 54, Patch: 15}
	for lib, want := range map[string]bool{"550.54.15": true, "550.54.14": false, "570.86.15": false, "garbage": false} {
		if got := sameVersion(lib, v); got != want {
			t.Errorf("%s: %v, want %v", lib, got, want)
		}
	}
}

// TestGrantFix: a fix grants its check's capabilities; the setcap command
// in it, filled in once every check has run, grants every capability the
// report finds missing, since setcap replaces a file's capabilities.
func TestGrantFix(t *testing.T) {
	e := &env{binary: "/usr/bin/arbiter"}
	fix := e.grantFix(capKill, caps.SysPtrace)
	want := "run arbiter as root, or grant CAP_KILL and CAP_SYS_PTRACE (" + setcapMarker + "; in a pod, securityContext.capabilities.add: [KILL, SYS_PTRACE])"
	if fix != want {
		t.Errorf("got  %q\nwant %q", fix, want)
	}
	if got, want := e.setcapCommand([]caps.Cap{caps.SysPtrace}), "setcap cap_sys_ptrace+ep /usr/bin/arbiter"; got != want {
		t.Errorf("one capability: %q, want %q", got, want)
	}
	e.grantFix(caps.BPF)
	if len(e.missing) != 3 {
		t.Fatalf("missing %v, want the three capabilities asked for", e.missing)
	}
	got := e.setcapCommand([]caps.Cap{caps.BPF, capKill})
	if !strings.HasPrefix(got, "setcap cap_bpf,cap_kill+ep /usr/bin/arbiter, every capability this report finds missing in one command") {
		t.Errorf("several: %q", got)
	}
}

// TestReportGrantsInOneCommand: without capabilities, every fix that
// grants some names the same setcap command, with all of them.
func TestReportGrantsInOneCommand(t *testing.T) {
	e := &env{root: "/", binary: "/usr/bin/arbiter"} // no capabilities held
	r := e.report()
	var cmds []string
	for _, c := range r.Checks {
		if strings.Contains(c.Fix, setcapMarker) {
			t.Errorf("%s: the marker is left in %q", c.Name, c.Fix)
		}
		if i := strings.Index(c.Fix, "setcap "); i >= 0 {
			cmds = append(cmds, c.Fix[i:strings.IndexByte(c.Fix[i:], ';')+i])
		}
	}
	if len(cmds) < 2 {
		t.Fatalf("setcap commands %q: want one in each capability's fix", cmds)
	}
	for _, c := range cmds[1:] {
		if c != cmds[0] {
			t.Errorf("fixes name different setcap commands: %q", cmds)
			break
		}
	}
	if !strings.Contains(cmds[0], "cap_bpf") || !strings.Contains(cmds[0], "cap_perfmon") || !strings.Contains(cmds[0], "cap_kill") {
		t.Errorf("setcap command %q lacks a capability that a check found missing", cmds[0])
	}
}

// TestRunRejectsBadRoot checks that a root that is not a directory is an
// error, not a report of a node without a driver.
func TestRunRejectsBadRoot(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{file, filepath.Join(file, "absent")} {
		if _, err := Run(&Options{Root: root}); err == nil || !strings.Contains(err.Error(), root) {
			t.Errorf("root %s: %v", root, err)
		}
	}
}

// TestLibcudaForwardCompat: a CUDA toolkit's forward-compatibility copy of
// another version is named but not a warning; a stray copy of another
// version elsewhere is.
func TestLibcudaForwardCompat(t *testing.T) {
	stub := cudastub.ForTest(t)
	lib, err := os.ReadFile(stub.Lib)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	put := func(rel string, b []byte) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("sys/module/nvidia/version", []byte("580.159.04\n"))
	put("proc/.keep", nil)
	put("usr/local/nvidia/lib64/libcuda.so.580.159.04", lib)
	put("usr/local/cuda/compat/libcuda.so.580.95.05", lib)
	e := &env{root: root}
	r := checkLibcuda(e)
	if r.status != OK || !strings.Contains(r.detail, "/usr/local/cuda/compat/libcuda.so.580.95.05: a CUDA forward-compatibility copy") {
		t.Errorf("forward-compatibility copy: %v %q", r.status, r.detail)
	}
	put("usr/lib64/libcuda.so.575.51.03", lib)
	r = checkLibcuda(e)
	if r.status != Warn || !strings.Contains(r.detail, "unless it is a forward-compatibility package: "+filepath.Join(root, "usr/lib64/libcuda.so.575.51.03")) {
		t.Errorf("stray copy of another version: %v %q", r.status, r.detail)
	}
	for _, p := range []string{"/usr/local/cuda/compat/libcuda.so.1", "/usr/local/cuda-12.4/compat/libcuda.so"} {
		if !forwardCompat(p) {
			t.Errorf("forwardCompat(%s) = false", p)
		}
	}
	for _, p := range []string{"/opt/compat/libcuda.so", "/usr/lib64/libcuda.so.1"} {
		if forwardCompat(p) {
			t.Errorf("forwardCompat(%s) = true", p)
		}
	}
}
