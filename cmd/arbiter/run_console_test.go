package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gpu-arbiter/arbiter/internal/consoletest"
	"github.com/gpu-arbiter/arbiter/internal/cudastub"
)

var screenshots = flag.String("screenshots", "", "TestDaemonConsoleInBrowser saves a PNG of each console page in this directory (../../docs/console)")

// hostileName is a process name a careless console would execute. The
// kernel keeps its first 15 bytes as the process's comm; its command
// line carries all of it and reaches the console through the policy's
// reason.
const hostileName = `<img src=x onerror=alert(1)>`

// consolePolicy classifies this test's workloads (ARBITER_TEST_CLASS
// console) by name: infer is latency-critical with an SLO, everything
// else best-effort with its command line as the reason. Every other CUDA
// process on the machine is only observed.
const consolePolicy = `package arbiter

import data.arbiter.lib

comm := input.process.comm

cmdline := concat(" ", input.process.cmdline)

ours if lib.env("ARBITER_TEST_CLASS") == "console"

classify := object.union(lib.classes["latency-critical"], {"reason": "serving: comm infer"}) if {
	ours
	comm == "infer"
} else := lib.with_reason(lib.classes["best-effort"], sprintf("batch job: %s", [cmdline])) if {
	ours
} else := default_decision

default_decision := {"class": "bystander", "preemption": {"mode": "observe"}, "reason": "not this console's"}
`

const consolePolicyTest = `package arbiter_test

import data.arbiter

test_infer_is_latency_critical if {
	d := arbiter.classify with input as {"process": {"comm": "infer", "cmdline": ["infer"], "env": {"ARBITER_TEST_CLASS": "console"}}}
	d.class == "latency-critical"
}
`

// TestDaemonConsoleInBrowser drives the console in headless Chromium
// against arbiter run, on the stub driver's inference and training
// workloads sharing one emulated GPU, and a training process named like
// an HTML element: the console loads with no error in the page and over
// the delta stream; the workloads appear and the training one's state
// changes as the engine gates it for the inference one's requests; the
// hostile name is shown as text; a policy with a syntax error is marked
// at its line; a valid policy applied changes the training workload's
// class in the table; and the stream-lost banner comes up when the
// daemon stops on SIGTERM, leaving no workload stopped. With
// -screenshots DIR it saves each page there (docs/console).
func TestDaemonConsoleInBrowser(t *testing.T) {
	node := newRecoverNode(t)
	stub := cudastub.ForTest(t)
	polDir := policyDir(t, map[string]string{"policy.rego": consolePolicy, "policy_test.rego": consolePolicyTest})
	d := startDaemon(t, node, polDir)
	token, err := os.ReadFile(tokenFile(filepath.Dir(node.stateDir)))
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + d.addr

	// The workloads share an emulated GPU of their own.
	gpu := fmt.Sprintf("console-%d", os.Getpid())
	t.Setenv("ARBITER_STUB_NODE", gpu)
	t.Cleanup(func() {
		left, _ := filepath.Glob("/dev/shm/arbiter-stubgpu-" + gpu + "-*")
		for _, f := range left {
			os.Remove(f)
		}
	})
	hostileBin := filepath.Join(t.TempDir(), hostileName)
	// A link: the program finds the stub library next to its target.
	if err := os.Symlink(stub.Train, hostileBin); err != nil {
		t.Fatal(err)
	}
	// Requests of 20 ms of kernels, 10 a second: the engine gates the
	// training processes for about a fifth of the time, at a rate the
	// console's preemption timeline keeps whole.
	infer := startWorkload(t, "console", stub.Infer, "--rate", "10", "--launches", "4", "--kernel-us", "5000", "--duration", "600").Process.Pid
	train := startWorkload(t, "console", stub.Train, "--kernel-us", "500", "--sync-every", "4", "--duration", "600").Process.Pid
	hostile := startWorkload(t, "console", hostileBin, "--kernel-us", "500", "--sync-every", "4", "--duration", "600").Process.Pid
	d.waitProcess(infer, "latency-critical", "")
	d.waitProcess(train, "best-effort", "")
	d.waitProcess(hostile, "best-effort", "")

	b := consoletest.New(t)
	b.Do(t, chromedp.Navigate(url+"/#/overview"))

	t.Run("loads", func(t *testing.T) {
		b.WaitFor(t, "overview tiles and the SLO card", `document.querySelectorAll('#ov-tiles .tile').length >= 6 && document.querySelectorAll('#ov-slo .slo').length === 1`, 15*time.Second)
		b.WaitFor(t, "the GPU card", `document.querySelectorAll('#ov-gpus .gpu').length >= 1`, 10*time.Second)
		b.WaitFor(t, "data time", `/data at \d\d:\d\d:\d\d/.test(document.getElementById('data-time').textContent)`, 5*time.Second)
		// The console follows the stream's delta form: one snapshot, then
		// deltas.
		for end := time.Now().Add(10 * time.Second); b.StreamEvents("delta") < 2 && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		}
		if !slices.ContainsFunc(b.Requests(), func(u string) bool { return strings.HasSuffix(u, "/api/v1/events?form=delta") }) ||
			b.StreamEvents("snapshot") != 1 || b.StreamEvents("delta") < 2 {
			t.Errorf("stream events: %d snapshots, %d deltas; requests %q", b.StreamEvents("snapshot"), b.StreamEvents("delta"), b.Requests())
		}
		b.CheckErrors(t)
	})

	t.Run("workloads live", func(t *testing.T) {
		b.Do(t, chromedp.Navigate(url+"/#/processes"))
		for _, pid := range []int{infer, train, hostile} {
			b.WaitFor(t, fmt.Sprintf("pid %d in the table", pid), consoletest.Cell(pid, consoletest.ColPID)+` === '`+fmt.Sprint(pid)+`'`, 10*time.Second)
		}
		// The engine gates train at its launches while an inference
		// request runs and lets it go after: the table follows.
		seen := map[string]bool{}
		for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline) && !(seen["gated"] && seen["running"]); time.Sleep(100 * time.Millisecond) {
			seen[consoletest.Eval[string](t, b, consoletest.Cell(train, consoletest.ColState))] = true
		}
		if !seen["gated"] || !seen["running"] {
			t.Errorf("states shown for train: %v; want gated and running\n%s", seen, d.output())
		}
		if lvl := consoletest.Eval[string](t, b, consoletest.Cell(train, consoletest.ColLevel)); !strings.HasPrefix(lvl, "gate") {
			t.Errorf("train's enforcement cell %q does not say gate", lvl)
		}
		if cls := consoletest.Eval[string](t, b, consoletest.Cell(infer, consoletest.ColClass)); cls != "latency-critical" {
			t.Errorf("infer's class cell %q", cls)
		}
	})

	t.Run("hostile name is text", func(t *testing.T) {
		if name := consoletest.Eval[string](t, b, consoletest.Cell(hostile, consoletest.ColName)); name != hostileName[:15] {
			t.Errorf("the hostile process's name shown as %q, want %q", name, hostileName[:15])
		}
		b.Click(t, fmt.Sprintf(`#pr-table tbody tr[data-pid="%d"]`, hostile))
		b.WaitFor(t, "the detail with the command line in the reason",
			`document.getElementById('pr-detail-body').textContent.includes(`+consoletest.JSString("batch job: "+hostileBin)+`)`, 5*time.Second)
		b.WaitFor(t, "why weaker", `document.getElementById('pr-detail-body').textContent.includes('gate instead of suspend')`, 5*time.Second)
		b.Screenshot(t, *screenshots, "processes")
		b.Do(t, chromedp.Navigate(url+"/#/events"))
		b.WaitFor(t, "the hostile process's classification in the event log",
			`[...document.querySelectorAll('#ev-table tbody td.reason')].some((td) => td.textContent.includes(`+consoletest.JSString(hostileName)+`))`, 10*time.Second)
		b.Screenshot(t, *screenshots, "events")
		imgs := consoletest.Eval[int](t, b, `document.querySelectorAll('img:not([src="/static/favicon.svg"])').length`)
		if _, dialogs := b.Problems(); imgs != 0 || len(dialogs) != 0 {
			t.Errorf("a name was parsed as HTML: %d foreign img elements, dialogs %q", imgs, dialogs)
		}
	})

	t.Run("charts", func(t *testing.T) {
		b.Do(t, chromedp.Navigate(url+"/#/charts"))
		b.WaitFor(t, "the latency chart of the SLO class, best-effort throughput and launch rates",
			`document.querySelectorAll('#ch-latency .uplot').length === 1 && document.querySelectorAll('.chart .uplot').length === 3`, 10*time.Second)
		b.WaitFor(t, "the preemption timeline", `document.querySelector('#ch-preempt canvas')?.getAttribute('aria-label')?.startsWith('preemptions of') ?? false`, 10*time.Second)
		if *screenshots != "" {
			time.Sleep(5 * time.Second) // a few seconds of series to show
		}
		b.Screenshot(t, *screenshots, "charts")
		consoletest.Eval[bool](t, b, `(document.getElementById('ch-preempt').scrollIntoView({block: 'end'}), true)`)
		b.Screenshot(t, *screenshots, "timeline")
		b.Do(t, chromedp.Navigate(url+"/#/overview"))
		b.WaitFor(t, "the overview", `document.querySelectorAll('#ov-slo .slo').length === 1`, 5*time.Second)
		b.Screenshot(t, *screenshots, "overview")
	})

	// brokenLine is the line of policy.rego the syntax error is put on.
	const brokenLine = 5
	t.Run("policy error at its line", func(t *testing.T) {
		lines := strings.Split(consolePolicy, "\n")
		if lines[brokenLine-1] != "comm := input.process.comm" {
			t.Fatalf("line %d of the policy is %q", brokenLine, lines[brokenLine-1])
		}
		lines[brokenLine-1] = "comm := input.process.comm)"
		b.Do(t, chromedp.Navigate(url+"/#/policy"))
		b.WaitFor(t, "the policy's files, with their text from the daemon",
			`[...document.querySelectorAll('#po-files button')].map((e) => e.textContent).join(',') === 'policy.rego,policy_test.rego' && `+
				`document.querySelector('#po-editor textarea').value === `+consoletest.JSString(consolePolicy), 10*time.Second)
		b.Do(t, chromedp.SendKeys(chromedp.ID("po-token"), strings.TrimSpace(string(token))), chromedp.Click(chromedp.ID("po-token-save")))
		b.SetEditor(t, strings.Join(lines, "\n"))
		b.Do(t, chromedp.Click(chromedp.ID("po-validate")))
		b.WaitFor(t, fmt.Sprintf("line %d marked, and only it", brokenLine),
			fmt.Sprintf(`document.querySelector('#po-editor .gutter').children[%d].classList.contains('error') && document.querySelectorAll('#po-editor .gutter .error').length === 1`, brokenLine-1), 10*time.Second)
		b.WaitFor(t, "the diagnostic names the file and line", `document.querySelector('#po-result .diag .where')?.textContent.startsWith('policy.rego:`+fmt.Sprint(brokenLine)+`:') ?? false`, 5*time.Second)
		b.Screenshot(t, *screenshots, "policy")
		if cur, _ := os.ReadFile(filepath.Join(polDir, "policy.rego")); string(cur) != consolePolicy {
			t.Error("validating a broken policy changed the policy directory")
		}
	})

	t.Run("apply changes a class", func(t *testing.T) {
		changed := strings.Replace(consolePolicy, `} else := lib.with_reason(lib.classes["best-effort"]`,
			`} else := object.union(lib.classes["best-effort"], {"class": "training", "priority": 200, "reason": "training jobs"}) if {
	ours
	comm == "train"
} else := lib.with_reason(lib.classes["best-effort"]`, 1)
		b.SetEditor(t, changed)
		b.Do(t, chromedp.Click(chromedp.ID("po-dryrun")))
		b.WaitFor(t, "the dry run names train's new class", `document.getElementById('po-result').textContent.includes('training')`, 15*time.Second)
		b.Screenshot(t, *screenshots, "policy-dry-run")
		b.Do(t, chromedp.Click(chromedp.ID("po-apply")), chromedp.Click(chromedp.ID("po-apply")))
		b.WaitFor(t, "applied", `document.getElementById('po-result').textContent.includes('Applied')`, 15*time.Second)
		b.WaitFor(t, "two revisions in the history", `document.querySelectorAll('#po-history li').length === 2`, 5*time.Second)
		b.Do(t, chromedp.Navigate(url+"/#/processes"))
		b.WaitFor(t, "train in class training", consoletest.Cell(train, consoletest.ColClass)+` === 'training'`, 15*time.Second)
		if cls := consoletest.Eval[string](t, b, consoletest.Cell(hostile, consoletest.ColClass)); cls != "best-effort" {
			t.Errorf("the hostile process (comm %q) moved to class %q", hostileName[:15], cls)
		}
		if cur, _ := os.ReadFile(filepath.Join(polDir, "policy.rego")); string(cur) != changed {
			t.Error("the applied policy is not what the policy directory holds")
		}
		b.CheckErrors(t)
	})

	t.Run("stream lost", func(t *testing.T) {
		b.Do(t, chromedp.Navigate(url+"/#/overview"))
		b.WaitFor(t, "live", `document.getElementById('stream-banner').hidden && document.getElementById('live-dot').classList.contains('live')`, 10*time.Second)
		if err := d.stop(syscall.SIGTERM); err != nil {
			t.Errorf("daemon stop: %v\n%s", err, d.output())
		}
		b.WaitFor(t, "the banner", `!document.getElementById('stream-banner').hidden && document.getElementById('stream-banner').textContent.includes('Live stream lost')`, 10*time.Second)
		b.WaitFor(t, "the countdown", `/Reconnecting in \d+s \(attempt \d+\)/.test(document.getElementById('stream-banner-text').textContent)`, 10*time.Second)
		b.Screenshot(t, *screenshots, "stream-lost")
		for _, pid := range []int{infer, train, hostile} {
			waitStopped(t, pid, false, "after the daemon stopped")
		}
	})
}
