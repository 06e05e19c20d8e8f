package deploy

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

const unitPath = "systemd/arbiter.service"

// unit is a parsed unit file: section -> key -> every value, in order.
type unit map[string]map[string][]string

func readUnit(t *testing.T) unit {
	t.Helper()
	return readUnitFile(t, unitPath)
}

// readUnitFile parses the unit file at path.
func readUnitFile(t *testing.T, path string) unit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not KEY=VALUE in a section: %q", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

// one returns the single value of key in section, failing the test when
// it is missing or set more than once.
func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	vs := u[section][key]
	if len(vs) != 1 {
		t.Fatalf("[%s] %s= set %d times, want once: %q", section, key, len(vs), vs)
	}
	return vs[0]
}

// words returns every space-separated word of every value of key.
func (u unit) words(section, key string) []string {
	var out []string
	for _, v := range u[section][key] {
		out = append(out, strings.Fields(v)...)
	}
	return out
}

// systemdAnalyze finds systemd-analyze; .ci/run installs systemd for it.
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		testenv.Skip(t, "systemd-analyze is not installed (apt-get install systemd)")
	}
	return p
}

// TestUnitVerifies runs `systemd-analyze verify` on the unit and fails on
// any message it prints. verify also checks that every command exists, so
// it runs against a root holding the unit, stand-ins for /usr/bin/arbiter
// and /bin/kill, and this machine's own system units (the targets the unit
// names).
func TestUnitVerifies(t *testing.T) {
	analyze := systemdAnalyze(t)
	root := t.TempDir()
	systemUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(systemUnits, "multi-user.target")); err != nil {
		testenv.Skip(t, "no systemd units in %s: %v", systemUnits, err)
	}
	if err := os.CopyFS(filepath.Join(root, systemUnits), os.DirFS(systemUnits)); err != nil {
		t.Fatal(err)
	}
	stub := []byte("#!/bin/sh\nexit 0\n")
	for _, p := range []string{"usr/bin/arbiter", "bin/kill"} {
		write(t, filepath.Join(root, p), stub, 0o755)
	}
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "etc/systemd/system/arbiter.service"), b, 0o644)

	out, err := exec.Command(analyze, "verify", "--root="+root, "arbiter.service").CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
	}

	// The check above must be able to fail: a unit with an unknown key
	// must make verify say so.
	write(t, filepath.Join(root, "etc/systemd/system/arbiter.service"), append(b, "NoSuchSetting=1\n"...), 0o644)
	out, _ = exec.Command(analyze, "verify", "--root="+root, "arbiter.service").CombinedOutput()
	if !bytes.Contains(out, []byte("NoSuchSetting")) {
		t.Fatalf("systemd-analyze verify said nothing of an unknown key: %q", out)
	}
}

// maxExposure is the highest `systemd-analyze security` exposure the unit
// may reach (0 safest, 10 unsandboxed); docs/install.md records the value.
const maxExposure = 4.0

func TestUnitSecurityExposure(t *testing.T) {
	analyze := systemdAnalyze(t)
	out, err := exec.Command(analyze, "security", "--offline=true", "--no-pager", unitPath).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for arbiter.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	level, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exposure %.1f", level)
	if level > maxExposure {
		t.Errorf("exposure %.1f is above %.1f: a sandbox setting was lost\n%s", level, maxExposure, out)
	}
}

// TestUnitAgreesWithDaemon checks the unit against what the daemon
// expects: its command lines, the directories of its default
// configuration, and the capabilities the code checks for.
func TestUnitAgreesWithDaemon(t *testing.T) {
	u := readUnit(t)
	const svc = "Service"
	want := map[string]string{
		"Type":         "notify",
		"NotifyAccess": "main",
		"ExecStart":    "/usr/bin/arbiter run --config " + config.DefaultPath,
		"ExecReload":   "/bin/kill -HUP $MAINPID",
		"ExecStopPost": "/usr/bin/arbiter recover",
		"Restart":      "on-failure",
	}
	for k, v := range want {
		if got := u.one(t, svc, k); got != v {
			t.Errorf("%s=%s, want %s", k, got, v)
		}
	}
	if u.one(t, svc, "WatchdogSec") == "" {
		t.Error("WatchdogSec= is empty")
	}

	d := config.Default()
	if got := "/var/lib/" + u.one(t, svc, "StateDirectory"); got != d.StateDir {
		t.Errorf("StateDirectory= gives %s, the daemon's default state_dir is %s", got, d.StateDir)
	}
	if got := "/run/" + u.one(t, svc, "RuntimeDirectory"); got != filepath.Dir(d.Socket) {
		t.Errorf("RuntimeDirectory= gives %s, the daemon's default socket is %s", got, d.Socket)
	}
	rw := u.words(svc, "ReadWritePaths")
	if !slices.ContainsFunc(rw, func(p string) bool { return d.BPFFS == p || strings.HasPrefix(d.BPFFS, p+"/") }) {
		t.Errorf("ReadWritePaths=%v does not hold the default bpffs pin directory %s", rw, d.BPFFS)
	}

	bounding := u.words(svc, "CapabilityBoundingSet")
	ambient := u.words(svc, "AmbientCapabilities")
	slices.Sort(bounding)
	slices.Sort(ambient)
	if !slices.Equal(bounding, ambient) {
		t.Errorf("CapabilityBoundingSet=%v and AmbientCapabilities=%v differ", bounding, ambient)
	}
	for _, c := range []caps.Cap{caps.BPF, caps.Perfmon, caps.SysPtrace, caps.SysNice} {
		if !slices.Contains(bounding, c.String()) {
			t.Errorf("the code checks for %s, which CapabilityBoundingSet= lacks", c)
		}
	}
	if slices.Contains(bounding, caps.SysAdmin.String()) {
		t.Errorf("CapabilityBoundingSet= grants %s; docs/install.md says why it is left out", caps.SysAdmin)
	}

	// Settings that would blind or break the daemon: a read-only
	// /sys/fs/bpf, hidden processes, no NVIDIA device nodes, capabilities
	// only inside a user namespace.
	forbidden := map[string][]string{
		"ProtectKernelTunables": {"yes", "true", "1", "on"},
		"ProtectProc":           {"invisible", "ptraceable", "noaccess"},
		"ProcSubset":            {"pid"},
		"PrivateDevices":        {"yes", "true", "1", "on"},
		"PrivateUsers":          {"yes", "true", "1", "on", "self", "identity"},
		"PrivateNetwork":        {"yes", "true", "1", "on"},
	}
	for k, bad := range forbidden {
		for _, v := range u[svc][k] {
			if slices.Contains(bad, strings.ToLower(v)) {
				t.Errorf("%s=%s breaks the daemon (see the comment in the unit)", k, v)
			}
		}
	}
	if u.one(t, "Install", "WantedBy") != "multi-user.target" {
		t.Error("WantedBy= is not multi-user.target")
	}
}

func write(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
}
