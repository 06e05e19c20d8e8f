package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// The package scripts run with systemctl and arbiter replaced by recorders
// on PATH: systemd is not PID 1 here, and `arbiter recover` must not touch
// this machine's processes. The scripts themselves run as dpkg and rpm run
// them, with the arguments each passes.

// scriptRun is one run of a package script.
type scriptRun struct {
	script  string   // file under scripts/
	args    []string // as dpkg or rpm passes them
	systemd bool     // run as on a host booted with systemd
	// recoverFails makes `arbiter recover` exit 1; force sets
	// ARBITER_FORCE_REMOVE=1.
	recoverFails, force bool
}

// run runs the script and returns the commands it ran, in order, its
// output, and whether it succeeded.
func (r scriptRun) run(t *testing.T) (calls []string, out string, ok bool) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	bin := filepath.Join(dir, "bin")
	recoverStatus := "0"
	if r.recoverFails {
		recoverStatus = "1"
	}
	// systemctl is-active says the service runs; is-enabled says it is not
	// enabled: the postinstall prints its advice either way.
	write(t, filepath.Join(bin, "systemctl"), []byte(`#!/bin/sh
echo "systemctl $*" >>"$CALLS"
case "$1" in is-enabled) exit 1 ;; esac
exit 0
`), 0o755)
	write(t, filepath.Join(bin, "arbiter"), []byte(`#!/bin/sh
echo "arbiter $*" >>"$CALLS"
exit `+recoverStatus+"\n"), 0o755)
	script, err := filepath.Abs(filepath.Join("scripts", r.script))
	if err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	if r.systemd {
		// A private mount namespace in which /run/systemd/system exists,
		// the test sd_booted(3) and the scripts make.
		cmd = exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-c",
			`mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && exec sh "$@"`, "sh", script}, r.args...)...)
	} else {
		cmd = exec.Command("sh", append([]string{script}, r.args...)...)
	}
	cmd.Env = append(os.Environ(), "PATH="+bin+":/usr/sbin:/usr/bin:/sbin:/bin", "CALLS="+log)
	if r.force {
		cmd.Env = append(cmd.Env, "ARBITER_FORCE_REMOVE=1")
	}
	b, err := cmd.CombinedOutput()
	if r.systemd && err != nil && strings.Contains(string(b), "unshare") {
		t.Fatalf("unshare: %v\n%s", err, b)
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	logged, _ := os.ReadFile(log)
	for l := range strings.Lines(string(logged)) {
		calls = append(calls, strings.TrimSpace(l))
	}
	return calls, string(b), err == nil
}

// starts matches a systemctl call that would start, restart or enable the
// service: what installing or upgrading must never do.
var starts = regexp.MustCompile(`^systemctl .*\b(start|restart|try-restart|reload-or-restart|enable|reenable|preset|--now)\b`)

func TestScriptsWithoutSystemd(t *testing.T) {
	cases := []struct {
		name  string
		run   scriptRun
		calls []string
		ok    bool
		out   string
	}{
		{"deb install", scriptRun{script: "postinstall.sh", args: []string{"configure", ""}}, nil, true, ""},
		{"rpm upgrade", scriptRun{script: "postinstall.sh", args: []string{"2"}}, nil, true, ""},
		{"deb upgrade keeps the daemon", scriptRun{script: "preremove.sh", args: []string{"upgrade", "1.3.0"}}, nil, true, ""},
		{"rpm upgrade keeps the daemon", scriptRun{script: "preremove.sh", args: []string{"1"}}, nil, true, ""},
		{"deb remove recovers", scriptRun{script: "preremove.sh", args: []string{"remove"}}, []string{"arbiter recover --detach"}, true, ""},
		{"rpm erase recovers", scriptRun{script: "preremove.sh", args: []string{"0"}}, []string{"arbiter recover --detach"}, true, ""},
		{"failed recover keeps the package", scriptRun{script: "preremove.sh", args: []string{"remove"}, recoverFails: true},
			[]string{"arbiter recover --detach"}, false, "the package stays installed"},
		{"forced removal", scriptRun{script: "preremove.sh", args: []string{"0"}, recoverFails: true, force: true},
			[]string{"arbiter recover --detach"}, true, "removing anyway"},
		{"deb postrm", scriptRun{script: "postremove.sh", args: []string{"remove"}}, nil, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls, out, ok := tc.run.run(t)
			if !slices.Equal(calls, tc.calls) || ok != tc.ok || !strings.Contains(out, tc.out) {
				t.Errorf("%s %v: calls %q, ok %v, output %q; want %q, %v, output with %q",
					tc.run.script, tc.run.args, calls, ok, out, tc.calls, tc.ok, tc.out)
			}
		})
	}
}

// TestScriptsUnderSystemd runs the scripts as on a host booted with
// systemd (needs root, for a private mount namespace).
func TestScriptsUnderSystemd(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to fake a systemd-booted host in a private mount namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		testenv.Skip(t, "unshare is not installed (apt-get install util-linux)")
	}
	cases := []struct {
		name  string
		run   scriptRun
		calls []string
	}{
		{"deb install", scriptRun{script: "postinstall.sh", args: []string{"configure", ""}},
			[]string{"systemctl daemon-reload", "systemctl is-active --quiet arbiter.service"}},
		{"rpm install", scriptRun{script: "postinstall.sh", args: []string{"1"}},
			[]string{"systemctl daemon-reload", "systemctl is-active --quiet arbiter.service"}},
		{"deb upgrade keeps the daemon", scriptRun{script: "preremove.sh", args: []string{"upgrade", "1.3.0"}}, nil},
		{"rpm upgrade keeps the daemon", scriptRun{script: "preremove.sh", args: []string{"1"}}, nil},
		{"deb remove stops, then recovers", scriptRun{script: "preremove.sh", args: []string{"remove"}},
			[]string{"systemctl stop arbiter.service", "systemctl disable arbiter.service", "arbiter recover --detach"}},
		{"rpm erase stops, then recovers", scriptRun{script: "preremove.sh", args: []string{"0"}},
			[]string{"systemctl stop arbiter.service", "systemctl disable arbiter.service", "arbiter recover --detach"}},
		{"deb postrm", scriptRun{script: "postremove.sh", args: []string{"remove"}}, []string{"systemctl daemon-reload"}},
		{"rpm postun upgrade", scriptRun{script: "postremove.sh", args: []string{"1"}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run.systemd = true
			calls, out, ok := tc.run.run(t)
			if !ok || !slices.Equal(calls, tc.calls) {
				t.Errorf("%s %v: calls %q, ok %v; want %q\n%s", tc.run.script, tc.run.args, calls, ok, tc.calls, out)
			}
			for _, c := range calls {
				if starts.MatchString(c) {
					t.Errorf("%s %v runs %q: installing must not start or enable the service", tc.run.script, tc.run.args, c)
				}
			}
		})
	}
	// The postinstall advises on what to do next instead.
	_, out, _ := scriptRun{script: "postinstall.sh", args: []string{"configure"}, systemd: true}.run(t)
	if !strings.Contains(out, "restart it when convenient") {
		t.Errorf("postinstall with the service running printed %q, want the advice to restart it", out)
	}
}

// TestScriptsNeverStartStatically reads every script: no command line
// (echoed advice aside) starts, restarts or enables the service, whatever
// arguments dpkg or rpm pass.
func TestScriptsNeverStartStatically(t *testing.T) {
	names, err := filepath.Glob("scripts/*.sh")
	if err != nil || len(names) != 3 {
		t.Fatalf("scripts: %v, %v; want postinstall, preremove and postremove", names, err)
	}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "#") || strings.HasPrefix(l, "echo ") {
				continue
			}
			if idx := strings.Index(l, "systemctl "); idx >= 0 && starts.MatchString(l[idx:]) {
				t.Errorf("%s:%d: %q starts or enables the service", n, i+1, l)
			}
		}
	}
	if !starts.MatchString("systemctl enable --now arbiter") || starts.MatchString("systemctl daemon-reload") {
		t.Fatal("the start pattern is broken")
	}
}
