package gpuvalidate

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// The tests below run scripts/gpu-validate.sh itself, from a bundle built
// by scripts/gpu-validate-bundle.sh, on the stub CUDA driver (capture and
// co-location sections) and the RM stand-in (nvrm and channels sections),
// and check the results it writes and the report rendered from them. They
// need root (eBPF, pidfd_getfd, mknod), Go and gcc; where
// ARBITER_REQUIRE_BPF is set, a missing one fails them.

// bundle is the one bundle built for all tests of this binary.
var bundle struct {
	once sync.Once
	dir  string
	err  error
}

// scriptBundle builds the validation bundle once, from this checkout.
func scriptBundle(t *testing.T) string {
	t.Helper()
	testenv.Privileged(t)
	for _, tool := range []string{"gcc", "bash", "timeout", "mkfifo", "mknod"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Skip(t, "%s not found: %v", tool, err)
		}
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			testenv.Skip(t, "go not found on PATH nor in GOROOT: the bundle is built with it")
		}
	}
	bundle.once.Do(func() {
		dir, err := os.MkdirTemp("", "arbiter-gpu-validate-bundle-")
		if err != nil {
			bundle.err = err
			return
		}
		bundle.dir = filepath.Join(dir, "gpu-validate")
		cmd := exec.Command("../../scripts/gpu-validate-bundle.sh", bundle.dir)
		cmd.Env = append(os.Environ(), "GO="+goTool)
		if out, err := cmd.CombinedOutput(); err != nil {
			bundle.err = errors.New("scripts/gpu-validate-bundle.sh: " + err.Error() + "\n" + string(out))
		}
	})
	if bundle.err != nil {
		t.Fatal(bundle.err)
	}
	return bundle.dir
}

// TestMain removes the bundle after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if bundle.dir != "" {
		os.RemoveAll(filepath.Dir(bundle.dir))
	}
	os.Exit(code)
}

// runScript runs the bundle's gpu-validate.sh with args, returning its
// standard error and exit status.
func runScript(t *testing.T, dir string, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "gpu-validate.sh"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stderr.String(), 0
	case errors.As(err, &ee):
		return stderr.String(), ee.ExitCode()
	}
	t.Fatalf("gpu-validate.sh: %v\n%s", err, stderr.String())
	return "", -1
}

// readResults parses a results directory's results.txt.
func readResults(t *testing.T, dir string) *Results {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "results.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Malformed) > 0 {
		t.Errorf("malformed results lines:\n%s", strings.Join(res.Malformed, "\n"))
	}
	return res
}

// noLeftovers checks that the run whose results are in dir left no
// process running (each carries GV_WORK=dir in its environment) and no
// tracer pinned (each section that pins one names it in its pin-path
// file). Other runs, of other checkouts' tests, may be under way beside it.
func noLeftovers(t *testing.T, dir string) {
	t.Helper()
	recorded, _ := filepath.Glob(filepath.Join(dir, "*", "pin-path"))
	for _, f := range recorded {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pin := strings.TrimSpace(string(b))
		if !strings.HasPrefix(pin, "/sys/fs/bpf/arbiter-validate-") {
			t.Errorf("%s names %q", f, pin)
			continue
		}
		if _, err := os.Stat(pin); err == nil {
			t.Errorf("pinned tracer left behind: %s", pin)
			os.RemoveAll(pin)
		}
	}
	abs, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	marker := []byte("\x00GV_WORK=" + abs + "\x00")
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		env, err := os.ReadFile(filepath.Join(p, "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), marker) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		t.Errorf("process %s left running: %s", filepath.Base(p), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
	}
}

// TestScriptStubAndStandin runs every section of the script in test mode
// and checks what each found, as results and as the rendered report.
func TestScriptStubAndStandin(t *testing.T) {
	// Its daemon section runs arbiter run.
	testenv.LockNodeDaemons(t)
	dir := scriptBundle(t)
	stub := cudastub.ForTest(t)
	standin, err := rmstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	results := filepath.Join(work, "results")
	out := filepath.Join(work, "report.md")
	log, code := runScript(t, dir, 5*time.Minute, "--stub", stub.Dir, "--standin", standin, "--results", results,
		"--out", out, "--trials", "3", "--cli-trials", "3", "--colocate-seconds", "2")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log)
	}
	for _, want := range []string{"gpu-validate: capture-cuda: start (budget 150s)", "gpu-validate: report in " + out} {
		if !strings.Contains(log, want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	res := readResults(t, results)
	if res.MetaValue("mode") != "test: stub CUDA driver and RM stand-in" || res.MetaValue("kernel") == "" || !strings.Contains(res.MetaValue("elapsed"), "of the 25-minute limit") {
		t.Errorf("meta: %+v", res.Meta)
	}
	verdicts := map[string]Status{}
	for _, s := range res.Sections {
		verdicts[s.Name] = s.Verdict()
	}
	// The stand-in's "kernel" is a CPU thread: the procedure must run
	// through and report that it never stopped.
	wantVerdicts := map[string]Status{"build": Skip, "capture-cuda": Pass, "capture-torch": Pass, "nvrm": Fail, "channels": Pass, "colocate": Pass, "daemon": Pass}
	for name, want := range wantVerdicts {
		if verdicts[name] != want {
			t.Errorf("section %s: %s, want %s", name, verdicts[name], want)
		}
	}
	if len(verdicts) != len(wantVerdicts) {
		t.Errorf("sections: %v", verdicts)
	}
	for section, checks := range map[string]map[string][2]string{
		"capture-cuda": {
			"attached":    {"PASS", "31 probes on " + stub.Lib},
			"launches":    {"PASS", "200 captured, the program made launches=200"},
			"copies":      {"PASS", "100 captured"},
			"syncs":       {"PASS", "50 captured"},
			"tracer_loss": {"PASS", "none dropped"},
			"exit":        {"PASS", "status 0"},
			"probe_cost":  {"INFO", "20000 launches back to back"},
		},
		"capture-torch": {
			"launches": {"PASS", "100 captured"},
			"syncs":    {"PASS", "11 captured"},
		},
		"nvrm": {
			"procedure":         {"PASS", "passed"},
			"alloc_traced":      {"PASS", "channel-group"},
			"set_timeslice":     {"PASS", "NV_OK"},
			"interleave":        {"PASS", "levels read back from the registry's record: low, high, medium"},
			"no_get_interleave": {"PASS", "never issued"},
			"after_resume":      {"PASS", "correct: stand-in"},
		},
		"channels": {
			"watch":        {"PASS", "channel-group ×3"},
			"list":         {"PASS", "3 groups"},
			"timeslice":    {"PASS", "set 200 µs"},
			"interleave":   {"PASS", "set low, high, medium"},
			"resume":       {"PASS", "resumed"},
			"after_resume": {"PASS", "correct: stand-in"},
		},
		"colocate": {
			"scenario.lc-alone":   {"INFO", "LC alone; LC "},
			"scenario.be-alone":   {"INFO", "BE alone; BE "},
			"scenario.default":    {"INFO", "of alone"},
			"scenario.timeslice":  {"SKIP", "the stub driver has no channel groups"},
			"scenario.suspend-be": {"SKIP", "the stub driver has no channel groups"},
			"scenarios":           {"PASS", "3 scenarios ran and reported, 3 skipped"},
		},
		// arbiter run on the stub's workloads: each level classified
		// both, held the BE as its level says (suspend falls back to the
		// gate: the stub has no channel groups) and exited cleanly.
		"daemon": {
			"daemon.observe":   {"PASS", "0 suspends, 0 gates, 0 enforcement errors"},
			"daemon.timeslice": {"PASS", "0 enforcement errors"},
			"daemon.suspend":   {"PASS", "0 enforcement errors"},
			"daemon.gate":      {"PASS", "0 enforcement errors"},
			"scenario.gate":    {"INFO", "side by side under arbiter run, BE at level gate"},
			"scenarios":        {"PASS", "7 scenarios ran and reported, 0 skipped"},
		},
	} {
		wantChecks(t, res.Section(section), checks)
	}
	nv := res.Section("nvrm")
	for _, c := range nv.Checks {
		if c.Status == Fail && !strings.Contains(c.Seen, "still running") {
			t.Errorf("nvrm: unexpected failure %s: %s", c.Name, c.Seen)
		}
	}
	ch := res.Section("channels")
	suspends := 0
	for _, c := range ch.Checks {
		if strings.HasPrefix(c.Name, "suspend.") {
			suspends++
			if c.Status != Pass || !strings.Contains(c.Seen, "3 trials") {
				t.Errorf("channels %s: %s %s", c.Name, c.Status, c.Seen)
			}
		}
		if strings.HasPrefix(c.Name, "stopped.") && c.Status != Skip {
			t.Errorf("channels %s: %s, want SKIP (the stand-in does not monitor)", c.Name, c.Status)
		}
	}
	if suspends == 0 {
		t.Error("channels: no suspend trials")
	}

	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	report := string(md)
	for _, want := range []string{
		"(not a hardware result)",
		"| Capture: a CUDA C program on real libcuda | PASS |",
		"| RM allocations and channel controls (nvrm's procedure) | FAIL |",
		"#### Channel control from the command line — PASS",
		"$BUNDLE/arbiter channels --state-dir $WORK/channels/state",
		"<details><summary>nvrm.test log</summary>",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if copy, err := os.ReadFile(filepath.Join(results, "report.md")); err != nil || !bytes.Equal(copy, md) {
		t.Errorf("results/report.md differs from --out (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(results, "channels", "pin-path")); err != nil {
		t.Errorf("the channels section did not say where it pinned its tracer: %v", err)
	}
	noLeftovers(t, results)
	if t.Failed() {
		t.Log("\n" + log + "\n" + report)
	}
}

// TestScriptNoDriver runs the script as on a server whose driver is not
// loaded: every section is skipped with the reason, and the report still
// comes out.
func TestScriptNoDriver(t *testing.T) {
	dir := scriptBundle(t)
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	results := filepath.Join(t.TempDir(), "results")
	log, code := runScript(t, dir, 2*time.Minute, "--results", results, "--out", filepath.Join(results, "out.md"))
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log)
	}
	res := readResults(t, results)
	if res.MetaValue("mode") != "hardware" || res.MetaValue("driver") != "none loaded" {
		t.Errorf("meta: %+v", res.Meta)
	}
	var names []string
	for _, s := range res.Sections {
		names = append(names, s.Name)
	}
	if want := []string{"build", "capture-cuda", "capture-torch", "nvrm", "channels", "colocate", "daemon"}; !slices.Equal(names, want) {
		t.Errorf("sections %q, want every section of the script: %q", names, want)
	}
	for _, s := range res.Sections {
		if s.End != Skip || !strings.HasPrefix(s.Why, "no NVIDIA driver: /dev/nvidiactl does not exist") {
			t.Errorf("section %s: %s %q", s.Name, s.End, s.Why)
		}
	}
}

// TestScriptBudgetAndInterrupt checks that a section past its budget is
// stopped and recorded as such, that an interrupt stops the run, and that
// neither leaves a workload running or a tracer pinned.
func TestScriptBudgetAndInterrupt(t *testing.T) {
	dir := scriptBundle(t)
	stub := cudastub.ForTest(t)
	results := filepath.Join(t.TempDir(), "results")
	start := time.Now()
	log, code := runScript(t, dir, 2*time.Minute, "--stub", stub.Dir, "--results", results, "--sections", "colocate",
		"--colocate-seconds", "40", "--budget", "colocate=4")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("a section with a 4 s budget took the run %v", took)
	}
	s := readResults(t, results).Section("colocate")
	if s == nil || s.End != Timeout || s.Why != "ran past its budget of 4 s and was stopped" {
		t.Errorf("colocate: %+v", s)
	}
	noLeftovers(t, results)

	// Interrupted: exit 130, partial results kept, nothing left running.
	results = filepath.Join(t.TempDir(), "results")
	cmd := exec.Command(filepath.Join(dir, "gpu-validate.sh"), "--stub", stub.Dir, "--results", results,
		"--sections", "colocate", "--colocate-seconds", "40")
	var stderr bytes.Buffer
	cmd.Stderr, cmd.Stdout = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("interrupted run: %v, want exit 130\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the run did not stop within 30 s of SIGINT\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted: partial results in") {
		t.Errorf("no word of the interrupt:\n%s", stderr.String())
	}
	noLeftovers(t, results)
}

// TestScriptUsage checks that bad options are refused before anything runs.
func TestScriptUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--trials", "many"}, "TRIALS must be a whole number"},
		{[]string{"--budget", "nvrm"}, "--budget nvrm: want SECTION=SECONDS"},
		{[]string{"--bogus"}, "unknown option --bogus"},
		{[]string{"--out"}, "--out needs a value (see --help)"},
		{[]string{"--bundle", "/nonexistent"}, "no arbiter in /nonexistent: build the bundle with 'make gpu-validate-bundle'"},
	} {
		log, code := runScript(t, "../../scripts", time.Minute, tc.args...)
		if code != 2 || !strings.Contains(log, tc.want) {
			t.Errorf("%v: exit %d, want 2 and %q:\n%s", tc.args, code, tc.want, log)
		}
	}
}

// TestShellcheck keeps the scripts shellcheck-clean where shellcheck is
// installed (apt-get install shellcheck).
func TestShellcheck(t *testing.T) {
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Skip("shellcheck not installed")
	}
	for _, f := range []string{"gpu-validate.sh", "gpu-validate-sections.sh", "gpu-validate-bundle.sh", "gpu-validate-nvrm.sh"} {
		if out, err := exec.Command(sc, "-x", filepath.Join("../../scripts", f)).CombinedOutput(); err != nil {
			t.Errorf("shellcheck %s: %v\n%s", f, err, out)
		}
	}
}
