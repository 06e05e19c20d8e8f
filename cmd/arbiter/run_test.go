package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/web"
)

// testPolicy classifies only this test's workloads, by their
// ARBITER_TEST_CLASS environment variable; every other CUDA process on
// the machine (other tests' workloads) is merely observed. Class "held"
// is gated with a GPU share of nothing: gated at its first launch and kept
// so, for the fail-safe tests.
const testPolicy = `package arbiter

import data.arbiter.lib

classify := object.union(lib.classes[c], {"reason": "ARBITER_TEST_CLASS"}) if {
	c := lib.env("ARBITER_TEST_CLASS")
	lib.classes[c]
} else := {"class": "held", "priority": 1, "preemption": {"mode": "gate"}, "quota": {"max_gpu_share": 0}, "reason": "held by the test"} if {
	lib.env("ARBITER_TEST_CLASS") == "held"
} else := default_decision

default_decision := {"class": "bystander", "preemption": {"mode": "observe"}, "reason": "not this test's"}
`

// testDaemon is `arbiter run` started from the test binary on a private
// bpffs and state directory.
type testDaemon struct {
	t    *testing.T
	node *recoverNode
	dir  string
	addr string // --listen
	cmd  *exec.Cmd
	log  *os.File
	// exited receives the daemon's exit once.
	exited chan error
	done   bool
}

func startDaemon(t *testing.T, node *recoverNode, policyDir string, extra ...string) *testDaemon {
	t.Helper()
	testenv.LockNodeDaemons(t)
	addr := freeAddr(t)
	d := &testDaemon{t: t, node: node, dir: filepath.Dir(node.stateDir), addr: addr}
	var err error
	d.log, err = os.CreateTemp(d.dir, "daemon-*.log")
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(os.Args[0], append([]string{"run", "--policy", policyDir, "--state-dir", filepath.Dir(node.stateDir),
		"--socket", d.socket(), "--bpffs", node.pinDir, "--listen", addr, "--log-format", "json"}, extra...)...)
	d.cmd.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.exited = make(chan error, 1)
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		if !d.done {
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	})
	var st web.StatusView
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-d.exited:
			d.done = true
			t.Fatalf("daemon exited at start: %v\n%s", err, d.output())
		default:
		}
		err := newDaemonClient(d.socket()).get(context.Background(), "status", &st)
		if err == nil && st.Ready {
			return d
		}
		if time.Now().After(end) {
			t.Fatalf("daemon not ready after 20 s: %v\n%s", err, d.output())
		}
	}
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (d *testDaemon) socket() string { return filepath.Join(d.dir, "arbiter.sock") }

func (d *testDaemon) output() string {
	b, _ := os.ReadFile(d.log.Name())
	return string(b)
}

// stop sends sig and waits for the daemon to exit; it returns how it
// exited.
func (d *testDaemon) stop(sig syscall.Signal) error {
	d.t.Helper()
	_ = d.cmd.Process.Signal(sig)
	select {
	case err := <-d.exited:
		d.done = true
		return err
	case <-time.After(10 * time.Second):
		d.t.Fatalf("daemon did not stop on %v\n%s", sig, d.output())
	}
	return nil
}

// metric reads one unlabelled sample of the daemon's /metrics.
func (d *testDaemon) metric(name string) float64 {
	d.t.Helper()
	resp, err := newDaemonClient(d.socket()).http.Get("http://arbiter/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				d.t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	d.t.Fatalf("no %s in /metrics:\n%s", name, b)
	return 0
}

func (d *testDaemon) processes() []web.ProcessItem {
	d.t.Helper()
	var pl web.ProcessList
	if err := newDaemonClient(d.socket()).get(context.Background(), "processes", &pl); err != nil {
		d.t.Fatal(err)
	}
	return pl.Processes
}

// waitProcess waits until the daemon shows pid with the given class and
// state.
func (d *testDaemon) waitProcess(pid int, class, state string) web.ProcessItem {
	d.t.Helper()
	var last []web.ProcessItem
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		last = d.processes()
		for _, p := range last {
			if int(p.PID) == pid && p.Class == class && (state == "" || p.State == state) {
				return p
			}
		}
	}
	d.t.Fatalf("pid %d never shown as %s/%s: %+v\n%s", pid, class, state, last, d.output())
	return web.ProcessItem{}
}

func startWorkload(t *testing.T, class, bin string, args ...string) *exec.Cmd {
	t.Helper()
	c := exec.Command(bin, args...)
	c.Env = append(os.Environ(), "ARBITER_TEST_CLASS="+class)
	var out strings.Builder
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.ProcessState == nil {
			_ = c.Process.Signal(syscall.SIGCONT)
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	return c
}

// TestDaemonGatesBestEffort: the daemon classifies the inference and
// training workloads by policy and, with no driver on this machine, gates
// the training one during the inference one's requests; both run to
// completion, and ps and status show it.
func TestDaemonGatesBestEffort(t *testing.T) {
	node := newRecoverNode(t)
	b := cudastub.ForTest(t)
	d := startDaemon(t, node, policyDir(t, map[string]string{"p.rego": testPolicy}))
	train := startWorkload(t, "best-effort", b.Train, "--kernel-us", "500", "--sync-every", "4", "--duration", "8")
	infer := startWorkload(t, "latency-critical", b.Infer, "--rate", "50", "--duration", "6")
	lc := d.waitProcess(infer.Process.Pid, "latency-critical", "")
	be := d.waitProcess(train.Process.Pid, "best-effort", "")
	if be.Level.String() != "gate" || !strings.Contains(be.Limit, "gate instead of suspend") || !lc.LatencyCritical {
		t.Errorf("processes: lc %+v\nbe %+v", lc, be)
	}
	for _, c := range []*exec.Cmd{infer, train} {
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v\n%s", c.Path, err, c.Stdout)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s still running after 60 s (left gated?): %+v\n%s", c.Path, d.processes(), d.output())
		}
	}
	if out := fmt.Sprint(train.Stdout); !strings.Contains(out, "launches in") {
		t.Errorf("train output: %s", out)
	}
	var st web.StatusView
	if err := newDaemonClient(d.socket()).get(context.Background(), "status", &st); err != nil {
		t.Fatal(err)
	}
	if st.Engine.Gates == 0 || st.Engine.Gates != st.Engine.Ungates || st.Engine.EnforceErrors != 0 {
		t.Errorf("engine: %+v", st.Engine)
	}
	// The training workload's gate was armed for the inference one's
	// requests, and their first calls closed it in the kernel.
	if st.Engine.Arms == 0 {
		t.Errorf("no gate armed: %+v", st.Engine)
	}
	if n := d.metric("arbiter_gate_armed_closes_total"); n == 0 {
		t.Errorf("arbiter_gate_armed_closes_total %v: no gate closed by an armed request", n)
	}
	// ps and status read the same socket.
	code, out := runMain(t, "ps", "--socket", d.socket())
	if code != 0 || !strings.HasPrefix(out, "PID") {
		t.Errorf("ps: exit %d\n%s", code, out)
	}
	code, out = runMain(t, "status", "--socket", d.socket())
	if code != 0 || !strings.Contains(out, "gate      supported") || !strings.Contains(out, "suspend   not supported") {
		t.Errorf("status: exit %d\n%s", code, out)
	}
	d.stop(syscall.SIGTERM)
	if !strings.Contains(d.output(), "every enforcement undone") {
		t.Errorf("no clean stop in the log:\n%s", d.output())
	}
	// A clean stop is no error: the driver trace closing on the way out
	// is part of it.
	if strings.Contains(d.output(), `"level":"error"`) {
		t.Errorf("errors logged on a clean stop:\n%s", d.output())
	}
}

// TestDaemonFailSafe: a process gated by a daemon that is killed (kill -9)
// stays stopped until arbiter recover or the next daemon start releases
// it, within a second either way; a clean stop releases it at once.
func TestDaemonFailSafe(t *testing.T) {
	node := newRecoverNode(t)
	b := cudastub.ForTest(t)
	pol := policyDir(t, map[string]string{"p.rego": testPolicy})
	d := startDaemon(t, node, pol)
	held := startWorkload(t, "held", b.Train, "--kernel-us", "200", "--sync-every", "4", "--duration", "60")
	pid := held.Process.Pid
	d.waitProcess(pid, "held", "gated")
	waitStopped(t, pid, true, "gated by the daemon")

	// 1. kill -9, then recover.
	d.stop(syscall.SIGKILL)
	time.Sleep(300 * time.Millisecond)
	if !isStopped(t, pid) {
		t.Fatal("the held process ran again with no one to release it: the gate did not survive the daemon")
	}
	start := time.Now()
	code, out := runMain(t, "recover", "--bpffs", node.pinDir, "--state-dir", filepath.Dir(node.stateDir))
	if code != 0 || !strings.Contains(out, fmt.Sprint(pid)) {
		t.Fatalf("recover: exit %d\n%s", code, out)
	}
	t.Logf("recover:\n%s", out)
	waitStopped(t, pid, false, "after recover")
	if took := time.Since(start); took > time.Second+500*time.Millisecond {
		t.Errorf("recover took %v", took)
	}

	// 2. gated again, kill -9, then a new daemon releases it at start.
	d = startDaemon(t, node, pol)
	d.waitProcess(pid, "held", "gated")
	waitStopped(t, pid, true, "gated by the second daemon")
	d.stop(syscall.SIGKILL)
	d = startDaemon(t, node, pol)
	if !strings.Contains(d.output(), "released processes a previous daemon left gated") {
		t.Errorf("the new daemon did not say it released the leftovers:\n%s", d.output())
	}
	// It gates the held process again at its next launch: that is its
	// policy. A clean stop releases it at once.
	d.waitProcess(pid, "held", "gated")
	waitStopped(t, pid, true, "gated by the third daemon")
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("clean stop with a process gated: %v\n%s", err, d.output())
	}
	waitStopped(t, pid, false, "after a clean stop")
	if !strings.Contains(d.output(), "every enforcement undone") {
		t.Errorf("no clean stop in the log:\n%s", d.output())
	}
}

// TestDaemonKilledWhileArmed: a daemon killed (kill -9) while the
// inference workload's requests close the training one's gate in the
// kernel leaves nothing that closes it again: after arbiter recover the
// training workload runs on while the inference one keeps making
// requests.
func TestDaemonKilledWhileArmed(t *testing.T) {
	node := newRecoverNode(t)
	b := cudastub.ForTest(t)
	d := startDaemon(t, node, policyDir(t, map[string]string{"p.rego": testPolicy}))
	train := startWorkload(t, "best-effort", b.Train, "--kernel-us", "1000", "--sync-every", "1", "--duration", "60")
	startWorkload(t, "latency-critical", b.Infer, "--rate", "100", "--duration", "60")
	for end := time.Now().Add(15 * time.Second); d.metric("arbiter_gate_armed_closes_total") < 10; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no armed request closed the training workload's gate within 15 s: %+v\n%s", d.processes(), d.output())
		}
	}
	d.stop(syscall.SIGKILL)
	code, out := runMain(t, "recover", "--bpffs", node.pinDir, "--state-dir", filepath.Dir(node.stateDir))
	if code != 0 {
		t.Fatalf("recover: exit %d\n%s", code, out)
	}
	pid := train.Process.Pid
	waitStopped(t, pid, false, "after recover")
	// A hundred requests a second, none of which may stop it now.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if isStopped(t, pid) {
			t.Fatalf("the training workload was stopped again after the daemon died and recover ran:\n%s", out)
		}
	}
}

// TestDaemonRefusesBadPolicy: a policy that fails its checks keeps the
// daemon from starting, naming the file, row and column.
func TestDaemonRefusesBadPolicy(t *testing.T) {
	node := newRecoverNode(t)
	bad := policyDir(t, map[string]string{"p.rego": "package arbiter\n\nclassify := {\"class\": }\n"})
	code, out := runMain(t, "run", "--policy", bad, "--state-dir", filepath.Dir(node.stateDir), "--socket", filepath.Join(t.TempDir(), "s"),
		"--bpffs", node.pinDir, "--log-format", "json")
	if code == 0 || !strings.Contains(out, "p.rego:3:") {
		t.Errorf("exit %d\n%s", code, out)
	}
}

// TestSecondDaemonRefused: a second daemon on the same node says another
// one runs, and leaves the first alone.
func TestSecondDaemonRefused(t *testing.T) {
	node := newRecoverNode(t)
	pol := policyDir(t, map[string]string{"p.rego": testPolicy})
	d := startDaemon(t, node, pol)
	code, out := runMain(t, "run", "--policy", pol, "--state-dir", filepath.Dir(node.stateDir), "--socket", filepath.Join(t.TempDir(), "s"),
		"--bpffs", node.pinDir, "--listen", freeAddr(t), "--log-format", "json")
	if code == 0 || !strings.Contains(out, "another arbiter is running") {
		t.Errorf("second daemon: exit %d\n%s", code, out)
	}
	_ = d.processes() // the first still answers (processes fails the test otherwise)
	d.stop(syscall.SIGTERM)
}

// TestLoggerPlainOffTerminal: the text log written to a file (a log file,
// the journal) has no colour codes; JSON stays JSON.
func TestLoggerPlainOffTerminal(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		f, err := os.Create(filepath.Join(t.TempDir(), "log"))
		if err != nil {
			t.Fatal(err)
		}
		cfg := config.Default()
		cfg.LogFormat = format
		l, err := newLogger(cfg, f)
		if err != nil {
			t.Fatal(err)
		}
		l.Info().Str("gpu", "0").Msg("hello")
		f.Close()
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("\x1b[")) || !bytes.Contains(b, []byte("hello")) {
			t.Errorf("%s log in a file: %q", format, b)
		}
		if format == "json" && !json.Valid(bytes.TrimSpace(b)) {
			t.Errorf("json log: %q", b)
		}
	}
}
