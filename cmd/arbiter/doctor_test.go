package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/preflight"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// doctorChecks are the checks doctor must report, in order.
var doctorChecks = []string{
	"kernel", "btf", "memlock", "bpf-permission", "perf-permission", "ring-buffer", "bpf-cookies", "uprobes",
	"raw-tracepoints", "ioctl-tracer", "bpffs", "libcuda", "nvml", "nvidia-driver", "control-devices",
	"client-validation", "pidfd-getfd", "interleave-privilege", "send-signal", "kill-privilege",
}

// The kernel and BPF checks that must pass as root on a kernel Arbiter
// supports.
var bpfChecks = []string{"kernel", "btf", "memlock", "bpf-permission", "perf-permission", "ring-buffer", "bpf-cookies", "uprobes", "raw-tracepoints", "ioctl-tracer"}

// doctorRun runs `arbiter doctor args...` as the real binary (the test
// binary re-executed into main), prefixed by the command pre (setpriv) if
// given, and returns its exit status, stdout and stderr.
func doctorRun(t *testing.T, pre []string, args ...string) (int, string, string) {
	t.Helper()
	argv := append(append(slices.Clone(pre), os.Args[0], "doctor"), args...)
	if len(pre) > 0 {
		argv[len(pre)] = privateCopy(t)
	}
	return runArgv(t, argv...)
}

// privateCopy copies the test binary where an unprivileged user can run
// it.
func privateCopy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "arbiter.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// checkLine returns the text line of check name: status, name, the rest.
func checkLine(t *testing.T, out, name string) (string, string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^(OK|WARN|FAIL) +` + regexp.QuoteMeta(name) + ` +(.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no line for check %s in:\n%s", name, out)
	}
	return m[1], m[2]
}

// levelLine returns what the summary says of level l.
func levelLine(t *testing.T, out, l string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + l + ` +(.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary line for level %s in:\n%s", l, out)
	}
	return m[1]
}

// TestDoctorAsRoot runs doctor as root on this machine: the kernel and
// BPF checks pass (each loads or attaches something real), and without an
// NVIDIA driver the driver check fails with its fix, refusing timeslice
// and suspend and naming the driver, while observe and gate stay
// supported and the exit status is 0.
func TestDoctorAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root: doctor's BPF checks load and attach programs")
	}
	code, out, errOut := doctorRun(t, nil)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, name := range bpfChecks {
		if st, rest := checkLine(t, out, name); st != "OK" {
			t.Errorf("%s: %s %s", name, st, rest)
		}
	}
	// The tests run in a mount namespace without tracefs: the ioctl
	// tracer must still attach, and say how.
	if _, rest := checkLine(t, out, "ioctl-tracer"); !strings.Contains(rest, "tracefs not mounted (not needed); the tracer attaches through ") {
		t.Errorf("ioctl-tracer: %s", rest)
	}
	if _, rest := checkLine(t, out, "uprobes"); !strings.Contains(rest, "uprobe PMU at /sys/bus/event_source/devices/uprobe; a uprobe attached and detached") {
		t.Errorf("uprobes: %s", rest)
	}
	for _, l := range []string{"observe", "gate"} {
		if s := levelLine(t, out, l); !strings.HasPrefix(s, "supported") {
			t.Errorf("%s: %s", l, s)
		}
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Log("an NVIDIA driver is loaded here: the no-driver case runs on an empty --root only")
	} else {
		assertNoDriver(t, out)
	}
	// An empty root has no driver, whatever this machine has.
	code, out, errOut = doctorRun(t, nil, "--root", t.TempDir())
	if code != 0 {
		t.Fatalf("empty root: exit %d\n%s%s", code, out, errOut)
	}
	assertNoDriver(t, out)
}

// assertNoDriver checks doctor's report of a node without a driver.
func assertNoDriver(t *testing.T, out string) {
	t.Helper()
	if st, rest := checkLine(t, out, "nvidia-driver"); st != "FAIL" || !strings.HasPrefix(rest, "no NVIDIA driver loaded: neither ") ||
		!strings.Contains(rest, " | fix: install the NVIDIA driver and load its kernel module (modprobe nvidia") {
		t.Errorf("nvidia-driver: %s %s", st, rest)
	}
	if st, rest := checkLine(t, out, "client-validation"); st != "FAIL" || !strings.Contains(rest, "(no NVIDIA driver loaded) | fix: ") {
		t.Errorf("client-validation: %s %s", st, rest)
	}
	for _, l := range []string{"timeslice", "suspend"} {
		if s := levelLine(t, out, l); !strings.HasPrefix(s, "not supported: ") || !strings.Contains(s, "nvidia-driver") {
			t.Errorf("%s: %s", l, s)
		}
	}
}

// TestDoctorUnprivileged runs doctor as an unprivileged user: the BPF
// permission check fails naming the capability and how to grant it, the
// exit status is 1, and the JSON says the node is not ready.
func TestDoctorUnprivileged(t *testing.T) {
	var pre []string
	if os.Geteuid() == 0 {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			testenv.Skip(t, "setpriv (util-linux) not installed")
		}
		pre = []string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"}
	}
	code, out, errOut := doctorRun(t, pre)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
	}
	st, rest := checkLine(t, out, "bpf-permission")
	if st != "FAIL" || !strings.HasPrefix(rest, "CAP_BPF (or CAP_SYS_ADMIN) is not held") ||
		!strings.Contains(rest, "| fix: run arbiter as root, or grant CAP_BPF (setcap ") ||
		!strings.Contains(rest, ",cap_perfmon,cap_bpf+ep ") || !strings.Contains(rest, "every capability this report finds missing in one command") {
		t.Errorf("bpf-permission: %s %s", st, rest)
	}
	if st, rest := checkLine(t, out, "perf-permission"); st != "FAIL" || !strings.Contains(rest, "CAP_PERFMON") {
		t.Errorf("perf-permission: %s %s", st, rest)
	}
	// What only a privileged process can test is not reported as passed.
	if st, rest := checkLine(t, out, "ring-buffer"); st != "WARN" || !strings.HasPrefix(rest, "not tested: ") {
		t.Errorf("ring-buffer: %s %s", st, rest)
	}
	if s := levelLine(t, out, "observe"); !strings.HasPrefix(s, "not supported: bpf-permission, perf-permission") {
		t.Errorf("observe: %s", s)
	}
	if !strings.Contains(errOut, "arbiter: this node cannot capture CUDA calls: bpf-permission, perf-permission failed") {
		t.Errorf("stderr: %s", errOut)
	}
	// The JSON of a node that is not ready still fits the schema.
	code, out, errOut = doctorRun(t, pre, "--format", "json")
	if doc := validDoctorJSON(t, doctorSchema(t), out); code != 1 || doc.Ready || doc.Levels[0].Supported {
		t.Errorf("--format json: exit %d, ready %v, observe %+v\n%s", code, doc.Ready, doc.Levels[0], errOut)
	}
}

// fakeRoot builds a tree with the NVIDIA driver's files claiming version
// banner, a libcuda of that version, and, as root, the device nodes.
func fakeRoot(t *testing.T, version, params string) string {
	t.Helper()
	root := t.TempDir()
	write := func(p, s string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  "+version+"  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
	write("proc/driver/nvidia/params", params)
	if os.Geteuid() == 0 {
		if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, minor := range map[string]uint32{"nvidiactl": 255, "nvidia0": 0, "nvidia1": 1} {
			if err := unix.Mknod(filepath.Join(root, "dev", name), unix.S_IFCHR|0o666, int(unix.Mkdev(195, minor))); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// TestDoctorDriverVersions points --root at fake trees whose driver is
// 550.54.15 (supported), 525.60.13 (refused, too old) and 999.1 (refused
// as unverified, accepted with --allow-unverified-driver).
func TestDoctorDriverVersions(t *testing.T) {
	strict := "RegistryDwords: \"\"\nRegistryDwordsPerDevice: \"\"\n"
	for _, tc := range []struct {
		version string
		flags   []string
		status  string
		detail  string
		fix     string
		control bool // timeslice and suspend supported (as root)
	}{
		{"550.54.15", nil, "OK", "550.54.15: channel control supported (layouts verified from 535.43.02 to 595.45.04)", "", true},
		{"525.60.13", nil, "FAIL", "525.60.13: refused, older than 535.43.02, the oldest whose parameter layouts channel control knows",
			"upgrade the driver to 535.43.02 or later (the 525 and 530 branches are end-of-life)", false},
		{"999.1", nil, "FAIL", "999.01: refused, newer than 595.45.04, the newest whose parameter layouts were verified",
			"use a driver up to 595.45.04, or accept the risk: run arbiter (and doctor) with --allow-unverified-driver", false},
		{"999.1", []string{"--allow-unverified-driver"}, "WARN", "999.01: newer than 595.45.04, accepted by --allow-unverified-driver: channel control assumes the 595 branch's layouts",
			"prefer a driver up to 595.45.04", true},
	} {
		t.Run(tc.version+strings.Join(tc.flags, ""), func(t *testing.T) {
			root := fakeRoot(t, tc.version, strict)
			code, out, errOut := doctorRun(t, nil, append([]string{"--root", root}, tc.flags...)...)
			st, rest := checkLine(t, out, "nvidia-driver")
			if st != tc.status || !strings.HasPrefix(rest, tc.detail) {
				t.Errorf("nvidia-driver: %s %s\nwant %s %s", st, rest, tc.status, tc.detail)
			}
			if tc.fix != "" && !strings.Contains(rest, " | fix: "+tc.fix) {
				t.Errorf("nvidia-driver fix: %s\nwant %s", rest, tc.fix)
			}
			if os.Geteuid() != 0 {
				return // the rest needs the BPF checks and device nodes
			}
			if code != 0 {
				t.Fatalf("exit %d\n%s%s", code, out, errOut)
			}
			if st, rest := checkLine(t, out, "client-validation"); st != "OK" || !strings.HasPrefix(rest, "strict (driver default)") {
				t.Errorf("client-validation: %s %s", st, rest)
			}
			if st, rest := checkLine(t, out, "control-devices"); st != "OK" || !strings.HasSuffix(rest, "2 GPU nodes: /dev/nvidia0, /dev/nvidia1") {
				t.Errorf("control-devices: %s %s", st, rest)
			}
			for _, l := range []string{"timeslice", "suspend"} {
				s := levelLine(t, out, l)
				if tc.control != strings.HasPrefix(s, "supported") || !tc.control && !strings.HasPrefix(s, "not supported: nvidia-driver failed") {
					t.Errorf("%s: %s (want supported: %v)", l, s, tc.control)
				}
			}
		})
	}
}

// TestDoctorFakeTree checks the file-based checks on a tree of a node
// with non-strict client validation, a libcuda whose name carries another
// version than the driver's, and the NVML library, and a control device
// that is a plain file.
func TestDoctorFakeTree(t *testing.T) {
	b := cudastub.ForTest(t)
	root := fakeRoot(t, "550.54.15", "RegistryDwords: \"RmValidateClientData=0x80\"\n")
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(b.Lib)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"} {
		if err := os.WriteFile(filepath.Join(lib, name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"libcuda.so.1": "libcuda.so.550.54.15", "libnvidia-ml.so.1": "libnvidia-ml.so.550.54.15"} {
		if err := os.Symlink(target, filepath.Join(lib, link)); err != nil {
			t.Fatal(err)
		}
	}
	compat := filepath.Join(root, "usr/local/cuda/compat")
	if err := os.MkdirAll(compat, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(compat, "libcuda.so.570.86.15"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Remove(filepath.Join(root, "dev/nvidiactl")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "dev/nvidiactl"), nil, 0o666); err != nil {
		t.Fatal(err)
	}

	_, out, _ := doctorRun(t, nil, "--root", root)
	st, rest := checkLine(t, out, "libcuda")
	// The CUDA toolkit's forward-compatibility copy of another version is
	// named, not warned about: only processes whose library path names it
	// load it.
	if st != "OK" || !strings.HasPrefix(rest, "2 found: "+filepath.Join(lib, "libcuda.so.1")+" (550.54.15; directory "+lib+"), "+
		filepath.Join(compat, "libcuda.so.570.86.15")+" (570.86.15; directory "+compat+")") ||
		!strings.HasSuffix(rest, "; "+filepath.Join(compat, "libcuda.so.570.86.15")+": a CUDA forward-compatibility copy, used only by processes whose library path names it") {
		t.Errorf("libcuda: %s %s", st, rest)
	}
	// The tree's NVML is the stub driver under NVML's name: found under
	// the root, loaded, and refused for not being NVML.
	if st, rest := checkLine(t, out, "nvml"); st != "WARN" || !strings.HasPrefix(rest, "NVML is not available: "+filepath.Join(lib, "libnvidia-ml.so.1")+" is not NVML: ") &&
		!strings.Contains(rest, "built without cgo") {
		t.Errorf("nvml: %s %s", st, rest)
	}
	if st, rest := checkLine(t, out, "client-validation"); st != "WARN" ||
		!strings.HasPrefix(rest, "non-strict (NVreg_RegistryDwords sets RmValidateClientData=0x80): channel control works only on processes of arbiter's own effective user | fix: remove RmValidateClientData") {
		t.Errorf("client-validation: %s %s", st, rest)
	}
	if st, rest := checkLine(t, out, "control-devices"); st != "FAIL" || !strings.Contains(rest, "is not the control device, character device 195:255") {
		t.Errorf("control-devices: %s %s", st, rest)
	}
	if s := levelLine(t, out, "timeslice"); !strings.HasPrefix(s, "not supported: control-devices failed") || !strings.Contains(s, "client-validation") {
		t.Errorf("timeslice: %s", s)
	}
}

// TestDoctorJSON checks that --format json is one object that fits the
// schema, with every check, each with a status, a detail and, unless OK,
// a fix, and the four levels, whose observe level agrees with ready and
// the exit status.
func TestDoctorJSON(t *testing.T) {
	code, out, errOut := doctorRun(t, nil, "--format", "json", "--root", fakeRoot(t, "525.60.13", ""))
	got := validDoctorJSON(t, doctorSchema(t), out)
	var names []string
	for _, c := range got.Checks {
		names = append(names, c.Name)
		if c.Status != preflight.OK && c.Status != preflight.Warn && c.Status != preflight.Fail {
			t.Errorf("%s: status %q", c.Name, c.Status)
		}
		if c.Detail == "" || (c.Status == preflight.OK) != (c.Fix == "") {
			t.Errorf("%s: %s, detail %q, fix %q", c.Name, c.Status, c.Detail, c.Fix)
		}
	}
	if !slices.Equal(names, doctorChecks) {
		t.Errorf("checks %v\nwant %v", names, doctorChecks)
	}
	if len(got.Levels) != 4 {
		t.Fatalf("levels %+v", got.Levels)
	}
	for i, l := range preflight.Levels() {
		if got.Levels[i].Level != l || got.Levels[i].Supported == (len(got.Levels[i].BlockedBy) > 0) {
			t.Errorf("level %d: %+v", i, got.Levels[i])
		}
	}
	if got.Levels[1].Supported || !slices.Contains(got.Levels[1].BlockedBy, "nvidia-driver") {
		t.Errorf("timeslice on driver 525: %+v", got.Levels[1])
	}
	if got.Ready != got.Levels[0].Supported || got.Ready != (code == 0) {
		t.Errorf("ready %v, observe %+v, exit %d\n%s", got.Ready, got.Levels[0], code, errOut)
	}
	if os.Geteuid() == 0 && !got.Ready {
		t.Errorf("not ready as root: %+v", got.Levels[0])
	}
}

// TestDoctorHelpNamesExitRule checks that the help's exit rule lists
// exactly the checks the observe level needs.
func TestDoctorHelpNamesExitRule(t *testing.T) {
	r, err := preflight.Run(&preflight.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	long := newDoctorCmd().Long
	_, rule, ok := strings.Cut(long, "Exit status: 0 when every check the observe level needs passed (")
	rule, _, ok2 := strings.Cut(rule, ":")
	if !ok || !ok2 {
		t.Fatalf("no exit rule in:\n%s", long)
	}
	var listed []string
	for _, f := range strings.Split(rule, ",") {
		listed = append(listed, strings.TrimSpace(f))
	}
	var want []string
	for _, c := range r.Checks {
		if slices.Contains(c.NeededBy, preflight.Observe) {
			want = append(want, c.Name)
		}
	}
	if !slices.Equal(listed, want) {
		t.Errorf("help lists %v, observe needs %v", listed, want)
	}
}

// TestDoctorBadInput checks the errors of bad flags.
func TestDoctorBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		code int // 2: used wrongly; 1: failed
	}{
		{[]string{"--format", "xml"}, `arbiter: --format "xml": want text or json`, 2},
		{[]string{"--root", "/nonexistent-root"}, `arbiter: --root /nonexistent-root: no such file or directory (the root the driver's files, /dev, /proc and the library directories are read under; default /)`, 2},
		{[]string{"--root", "/etc/hostname"}, `arbiter: --root /etc/hostname: not a directory (`, 2},
		{[]string{"extra"}, `arbiter: unknown command "extra" for "arbiter doctor"`, 2},
	} {
		code, out, errOut := doctorRun(t, nil, tc.args...)
		if code != tc.code || out != "" || !strings.HasPrefix(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q\nwant exit %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
}
