package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/web"
)

// installVersion is the version the test's package is built with.
const installVersion = "v7.8.9-1-gabc1234"

// TestDebInstallsAndRuns builds the .deb as a release does (make dist,
// for this machine's architecture), installs it with dpkg into an empty
// root that has only what dpkg's maintainer scripts need (a shell, and a
// systemctl that records its calls, as on a host booted with systemd),
// and checks what a node gets:
//   - dpkg records the package as installed, with its configuration files;
//     every file is where it belongs, with its mode and the content of its
//     source; the maintainer scripts neither enable nor start the service;
//   - `systemd-analyze verify --root` accepts the installed unit, with the
//     installed binary as its ExecStart (nothing rewritten);
//   - the unit's ExecStart, unchanged, run in that root (chroot) with the
//     unit's capabilities and process settings (unitExec) and the
//     directories and environment systemd gives it, reaches READY=1 on a
//     notification socket the test listens on, from its main pid; answers
//     `arbiter status` on its default socket; traces a stub-driver CUDA
//     process; stops cleanly on SIGTERM (STOPPING=1, exit 0);
//   - ExecStopPost (`arbiter recover`) then finds nothing to recover;
//   - `dpkg --purge` removes it all, running `arbiter recover --detach` on the way.
func TestDebInstallsAndRuns(t *testing.T) {
	testenv.Privileged(t)
	testenv.LockNodeDaemons(t)
	analyze := systemdAnalyze(t)
	for _, p := range []string{"dpkg", "dpkg-query", "ldd"} {
		if _, err := exec.LookPath(p); err != nil {
			testenv.Skip(t, "%s is not installed (apt-get install dpkg libc-bin): %v", p, err)
		}
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	deb := buildDeb(t, repo, dist)
	root := filepath.Join(t.TempDir(), "root")
	calls := newBaseRoot(t, root)

	// 1. Install.
	start := time.Now()
	if out, err := exec.Command("dpkg", "--root="+root, "--install", deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg --install: %v\n%s", err, out)
	}
	t.Logf("dpkg --install took %v", time.Since(start).Round(time.Millisecond))
	checkInstalled(t, repo, dist, root)
	checkNotStarted(t, root, calls())

	// 2. The installed unit, verified with the installed binary as its
	// ExecStart: --root resolves every path inside the root.
	out, err := exec.Command(analyze, "verify", "--root="+root, "arbiter.service").CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify --root %s arbiter.service: %v\n%s", root, err, out)
	}

	// 3. Run it as the unit says.
	u := readUnitFile(t, filepath.Join(root, "usr/lib/systemd/system/arbiter.service"))
	if u.one(t, "Service", "Type") != "notify" || u.one(t, "Service", "NotifyAccess") != "main" {
		t.Fatalf("the unit is no longer Type=notify, NotifyAccess=main: update this test")
	}
	mountNode(t, root)
	serviceDirs(t, u, root)
	runService(t, u, root)

	// 4. Remove it.
	if out, err := exec.Command("dpkg", "--root="+root, "--purge", "arbiter").CombinedOutput(); err != nil {
		t.Fatalf("dpkg --purge: %v\n%s", err, out)
	}
	if got := calls(); !slices.Contains(got, "systemctl stop arbiter.service") {
		t.Errorf("the removal did not stop the service: %q", got)
	}
	for _, p := range []string{"usr/bin/arbiter", "usr/lib/systemd/system/arbiter.service", "etc/arbiter", "var/lib/arbiter"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("/%s left after purge: %v", p, err)
		}
	}
}

// buildDeb runs `make dist` for this machine's architecture into dist
// and returns the .deb.
func buildDeb(t *testing.T, repo, dist string) string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("make", "-C", repo, "dist", "DIST="+dist, "DIST_ARCHES="+runtime.GOARCH, "VERSION="+installVersion)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make dist: %v\n%s", err, out)
	}
	t.Logf("make dist (%s) took %v", runtime.GOARCH, time.Since(start).Round(time.Millisecond))
	debs, err := filepath.Glob(filepath.Join(dist, "*.deb"))
	if err != nil || len(debs) != 1 {
		t.Fatalf("make dist wrote %v (%v), want one .deb", debs, err)
	}
	return debs[0]
}

// newBaseRoot makes the empty root dpkg installs into: dpkg's database,
// /bin/sh and /bin/rm for the maintainer scripts, /dev/null, /tmp,
// /bin/kill (the unit's ExecReload), systemd's own units (what the unit is ordered
// after) and a systemctl that records its calls. /run/systemd/system
// makes the scripts behave as on a host booted with systemd. It returns
// a function that reads the recorded calls.
func newBaseRoot(t *testing.T, root string) func() []string {
	t.Helper()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log", "usr/bin", "run/systemd/system", "dev", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644)
	for _, dev := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"random", 1, 8}, {"urandom", 1, 9}} {
		if err := unix.Mknod(filepath.Join(root, "dev", dev.name), unix.S_IFCHR|0o666, int(unix.Mkdev(dev.major, dev.minor))); err != nil {
			t.Fatal(err)
		}
	}
	// The programs of an essential base system that the maintainer
	// scripts (sh, rm) and the unit (kill) use.
	for _, p := range []string{"/bin/sh", "/bin/rm", "/bin/kill"} {
		copyProgram(t, p, root)
	}
	const units = "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(units, "multi-user.target")); err != nil {
		testenv.Skip(t, "no systemd units in %s (apt-get install systemd): %v", units, err)
	}
	if err := os.CopyFS(filepath.Join(root, units), os.DirFS(units)); err != nil {
		t.Fatal(err)
	}
	// is-active and is-enabled answer "no": the service neither runs nor
	// is enabled, as on a node that never had it.
	write(t, filepath.Join(root, "usr/bin/systemctl"), []byte(`#!/bin/sh
echo "systemctl $*" >>/var/log/systemctl.calls
case "$1" in is-active | is-enabled) exit 3 ;; esac
exit 0
`), 0o755)
	return func() []string {
		b, _ := os.ReadFile(filepath.Join(root, "var/log/systemctl.calls"))
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
}

// copyProgram copies the host's program at path into root, with the
// shared libraries it loads (as ldd lists them).
func copyProgram(t *testing.T, path, root string) {
	t.Helper()
	out, err := exec.Command("ldd", path).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", path, err)
	}
	files := []string{path}
	files = append(files, regexp.MustCompile(`(?m)(/\S+)`).FindAllString(string(out), -1)...)
	for _, f := range files {
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(real)
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(root, f), b, 0o755)
	}
}

// checkInstalled compares what dpkg installed with the package's sources.
func checkInstalled(t *testing.T, repo, dist, root string) {
	t.Helper()
	q, err := exec.Command("dpkg-query", "--root="+root, "-W", "-f", "${Status}|${Version}|${Architecture}", "arbiter").CombinedOutput()
	if want := "install ok installed|7.8.9+1.gabc1234|" + runtime.GOARCH; err != nil || string(q) != want {
		t.Errorf("dpkg-query: %q, %v; want %q", q, err, want)
	}
	want := map[string]struct {
		src  string
		mode os.FileMode
	}{
		"/usr/bin/arbiter":                        {filepath.Join(dist, "arbiter-linux-"+runtime.GOARCH), 0o755},
		"/usr/lib/systemd/system/arbiter.service": {filepath.Join(repo, "deploy/systemd/arbiter.service"), 0o644},
		"/etc/arbiter/config.yaml":                {filepath.Join(repo, "deploy/config.yaml"), 0o644},
		"/usr/share/doc/arbiter/README.md":        {filepath.Join(repo, "README.md"), 0o644},
		"/usr/share/doc/arbiter/install.md":       {filepath.Join(repo, "docs/install.md"), 0o644},
		"/usr/share/doc/arbiter/copyright":        {filepath.Join(repo, "LICENSE"), 0o644},
	}
	policies, err := filepath.Glob(filepath.Join(repo, "rego/default/*.rego"))
	if err != nil || len(policies) == 0 {
		t.Fatalf("no default policy: %v", err)
	}
	conffiles := []string{"/etc/arbiter/config.yaml"}
	for _, p := range policies {
		dst := "/etc/arbiter/policy.d/" + filepath.Base(p)
		want[dst] = struct {
			src  string
			mode os.FileMode
		}{p, 0o644}
		conffiles = append(conffiles, dst)
	}
	// Every regular file dpkg lists is one of these, and each is there.
	list, err := exec.Command("dpkg", "--root="+root, "--listfiles", "arbiter").Output()
	if err != nil {
		t.Fatalf("dpkg --listfiles: %v", err)
	}
	var files []string
	for _, p := range strings.Fields(string(list)) {
		if st, err := os.Lstat(filepath.Join(root, p)); err == nil && st.Mode().IsRegular() {
			files = append(files, p)
		}
	}
	slices.Sort(files)
	if w := slices.Sorted(maps.Keys(want)); !slices.Equal(files, w) {
		t.Errorf("installed files\n%s\nwant\n%s", strings.Join(files, "\n"), strings.Join(w, "\n"))
	}
	for p, w := range want {
		st, err := os.Stat(filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		got, _ := os.ReadFile(filepath.Join(root, p))
		src, err := os.ReadFile(w.src)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != w.mode || !bytes.Equal(got, src) {
			t.Errorf("%s: mode %v, %d bytes; want %v and the content of %s (%d bytes)", p, st.Mode().Perm(), len(got), w.mode, w.src, len(src))
		}
	}
	if st, err := os.Stat(filepath.Join(root, "etc/arbiter/policy.d")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o755 {
		t.Errorf("/etc/arbiter/policy.d: %v, %v; want a directory with mode 0755", st, err)
	}
	cf, err := exec.Command("dpkg-query", "--root="+root, "-W", "-f", "${Conffiles}", "arbiter").Output()
	if err != nil {
		t.Fatal(err)
	}
	var gotConf []string
	for l := range strings.Lines(string(cf)) {
		if f := strings.Fields(l); len(f) >= 2 {
			gotConf = append(gotConf, f[0])
		}
	}
	slices.Sort(gotConf)
	slices.Sort(conffiles)
	if !slices.Equal(gotConf, conffiles) {
		t.Errorf("configuration files %v, want %v", gotConf, conffiles)
	}
	v, err := exec.Command(filepath.Join(root, "usr/bin/arbiter"), "version").CombinedOutput()
	if err != nil || !strings.Contains(string(v), installVersion) {
		t.Errorf("installed arbiter version: %q, %v; want %s", v, err, installVersion)
	}
}

// checkNotStarted checks that installing asked systemd nothing but to
// reload its units and whether the service runs or is enabled.
func checkNotStarted(t *testing.T, root string, calls []string) {
	t.Helper()
	want := []string{"systemctl daemon-reload", "systemctl is-active --quiet arbiter.service", "systemctl is-enabled --quiet arbiter.service"}
	if !slices.Equal(calls, want) {
		t.Errorf("the maintainer scripts called %q, want %q", calls, want)
	}
	for _, c := range calls {
		if starts.MatchString(c) {
			t.Errorf("installing ran %q: it must not start or enable the service", c)
		}
	}
	wants, _ := filepath.Glob(filepath.Join(root, "etc/systemd/system/*.wants/arbiter.service"))
	if len(wants) > 0 {
		t.Errorf("installing enabled the service: %v", wants)
	}
}

// mountNode mounts what the daemon reads of the node into root: /proc,
// /sys and a BPF filesystem at /sys/fs/bpf (a fresh one, so its pins are
// the test's alone). They are in the tests' own mount namespace (TestMain).
func mountNode(t *testing.T, root string) {
	t.Helper()
	for _, m := range []struct{ src, dir, fstype string }{
		{"proc", "proc", "proc"}, {"sysfs", "sys", "sysfs"}, {"bpf", "sys/fs/bpf", "bpf"},
	} {
		dir := filepath.Join(root, m.dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(m.src, dir, m.fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			t.Fatalf("mount %s on %s: %v", m.fstype, dir, err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
		})
	}
}

// serviceDirs creates the state and runtime directories as systemd does
// for StateDirectory= and RuntimeDirectory= (with their modes).
func serviceDirs(t *testing.T, u unit, root string) {
	t.Helper()
	for _, d := range []struct{ key, base string }{{"StateDirectory", "var/lib"}, {"RuntimeDirectory", "run"}} {
		mode, err := strconv.ParseUint(u.one(t, "Service", d.key+"Mode"), 8, 32)
		if err != nil {
			t.Fatalf("%sMode=: %v", d.key, err)
		}
		dir := filepath.Join(root, d.base, u.one(t, "Service", d.key))
		if err := os.MkdirAll(dir, os.FileMode(mode)); err != nil {
			t.Fatal(err)
		}
	}
}

// runService starts the unit's ExecStart in root, checks it as the
// service manager and an operator would, stops it and runs ExecStopPost.
func runService(t *testing.T, u unit, root string) {
	t.Helper()
	notify := listenNotify(t, filepath.Join(root, "run/systemd/notify"))
	start := serviceExec(t, u, root, strings.Fields(u.one(t, "Service", "ExecStart")))
	start.Env = append(start.Env, "NOTIFY_SOCKET=/run/systemd/notify")
	cmd := start.command(t)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "daemon.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	log := daemonLog(logFile.Name())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", log)
		}
	})
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once the daemon exited, waitErr set.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	pid := cmd.Process.Pid
	if msg := notify.wait(t, "READY=1", 30*time.Second, exited); msg.pid != pid {
		t.Fatalf("READY=1 came from pid %d, not the main process %d (NotifyAccess=main would ignore it)", msg.pid, pid)
	}
	t.Logf("ready %v after ExecStart", time.Since(begin).Round(time.Millisecond))
	checkServiceCaps(t, u, pid)

	// An operator's commands, run in the same root with no flags: they
	// find the daemon where the installed configuration puts it.
	status := arbiterInRoot(t, root, "status", "--format", "json")
	var st web.StatusView
	if err := json.Unmarshal([]byte(status), &st); err != nil {
		t.Fatalf("arbiter status: %v\n%s", err, status)
	}
	if !st.Ready || st.Version != installVersion || st.Policy == nil ||
		!slices.ContainsFunc(st.Policy.Files, func(f string) bool { return strings.HasSuffix(f, "policy.rego") }) {
		t.Errorf("arbiter status: %s", status)
	}
	checkTraces(t, root)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	notify.wait(t, "STOPPING=1", 10*time.Second, nil)
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("exit on SIGTERM: %v", waitErr)
		}
	case <-time.After(30 * time.Second): // TimeoutStopSec=
		t.Fatal("no exit 30 s after SIGTERM")
	}
	if out := log.String(); !strings.Contains(out, "every enforcement undone") || strings.Contains(out, `"level":"error"`) {
		t.Error("not a clean stop (the log has no \"every enforcement undone\", or has errors)")
	}

	// ExecStopPost, with the service's settings, as systemd runs it.
	post := serviceExec(t, u, root, strings.Fields(u.one(t, "Service", "ExecStopPost")))
	pc := post.command(t)
	var stderr bytes.Buffer
	pc.Stderr = &stderr
	out, err := pc.Output()
	if err != nil || string(out) != "nothing to recover\n" {
		t.Errorf("ExecStopPost %v: %v\n%s%s", post.Argv, err, out, stderr.String())
	}
}

// daemonLog is the daemon's log file.
type daemonLog string

func (l daemonLog) String() string {
	b, _ := os.ReadFile(string(l))
	return string(b)
}

// checkServiceCaps checks that the daemon runs with exactly the unit's
// capabilities and no_new_privs.
func checkServiceCaps(t *testing.T, u unit, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var want uint64
	for _, name := range u.words("Service", "CapabilityBoundingSet") {
		want |= 1 << unitCaps[name]
	}
	fields := map[string]string{}
	for l := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	eff, err := strconv.ParseUint(fields["CapEff"], 16, 64)
	if err != nil || eff != want || fields["NoNewPrivs"] != "1" {
		t.Errorf("daemon CapEff %s NoNewPrivs %s, want %016x and 1", fields["CapEff"], fields["NoNewPrivs"], want)
	}
}

// checkTraces runs a stub-driver CUDA process beside the daemon and waits
// for `arbiter ps` to list it.
func checkTraces(t *testing.T, root string) {
	t.Helper()
	b := cudastub.ForTest(t)
	w := exec.Command(b.Train, "--kernel-us", "200", "--sync-every", "4", "--duration", "20")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Process.Kill(); _ = w.Wait() }()
	var last string
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		last = arbiterInRoot(t, root, "ps", "--format", "json")
		var pl web.ProcessList
		if err := json.Unmarshal([]byte(last), &pl); err != nil {
			t.Fatalf("arbiter ps: %v\n%s", err, last)
		}
		for _, p := range pl.Processes {
			if int(p.PID) == w.Process.Pid {
				return
			}
		}
	}
	t.Errorf("the daemon never listed the stub CUDA process %d: %s", w.Process.Pid, last)
}

// arbiterInRoot runs the installed arbiter in root, as root with no
// flags but args, and returns its standard output.
func arbiterInRoot(t *testing.T, root string, args ...string) string {
	t.Helper()
	e := unitExec{Root: root, Argv: append([]string{"/usr/bin/arbiter"}, args...), Umask: -1, Env: []string{"PATH=/usr/bin:/bin"}}
	cmd := e.command(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("arbiter %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

// notifySocket is the service manager's end of the notification protocol.
type notifySocket struct {
	msgs chan notifyMsg
}

// notifyMsg is one datagram and the pid that sent it (SCM_CREDENTIALS).
type notifyMsg struct {
	pid    int
	fields []string
}

// listenNotify listens on a unixgram socket at path, with sender
// credentials, as systemd's notification socket.
func listenNotify(t *testing.T, path string) *notifySocket {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }); err != nil || serr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, serr)
	}
	n := &notifySocket{msgs: make(chan notifyMsg, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf, oob := make([]byte, 4096), make([]byte, 1024)
		for ctx.Err() == nil {
			nb, noob, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := notifyMsg{fields: strings.Split(strings.TrimSpace(string(buf[:nb])), "\n")}
			if cms, err := unix.ParseSocketControlMessage(oob[:noob]); err == nil {
				for _, cm := range cms {
					if cred, err := unix.ParseUnixCredentials(&cm); err == nil {
						m.pid = int(cred.Pid)
					}
				}
			}
			n.msgs <- m
		}
	}()
	t.Cleanup(func() { cancel(); c.Close(); <-done })
	return n
}

// wait returns the first message holding field, failing the test after d
// or once exited is closed (the process ended first).
func (n *notifySocket) wait(t *testing.T, field string, d time.Duration, exited <-chan struct{}) notifyMsg {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case m := <-n.msgs:
			if slices.Contains(m.fields, field) {
				return m
			}
		case <-exited:
			t.Fatalf("the service exited before %s", field)
		case <-timeout:
			t.Fatalf("no %s on the notification socket after %v", field, d)
		}
	}
}
