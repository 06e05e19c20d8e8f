package console_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/web"
	"github.com/gpu-arbiter/arbiter/web/console"
)

var screenshots = flag.String("screenshots", "", "save a PNG of each console page in this directory (docs/console)")

// TestHandler: the files are served with their types, ETags that
// revalidate, the CSP, and clear refusals.
func TestHandler(t *testing.T) {
	h := console.Handler()
	for _, c := range []struct {
		method, path string
		code         int
		ctype        string
	}{
		{"GET", "/", 200, "text/html; charset=utf-8"},
		{"GET", "/index.html", 200, "text/html; charset=utf-8"},
		{"GET", "/static/js/main.js", 200, "text/javascript; charset=utf-8"},
		{"GET", "/static/console.css", 200, "text/css; charset=utf-8"},
		{"GET", "/vendor/uplot/uPlot.iife.min.js", 200, "text/javascript; charset=utf-8"},
		{"GET", "/vendor/uplot/LICENSE", 200, "text/plain; charset=utf-8"},
		{"HEAD", "/", 200, "text/html; charset=utf-8"},
		{"GET", "/static/", 404, ""},
		{"GET", "/nope.js", 404, ""},
		{"GET", "/../console.go", 404, ""},
		{"POST", "/", 405, ""},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != c.code {
			t.Errorf("%s %s: %d, want %d: %s", c.method, c.path, rec.Code, c.code, rec.Body)
			continue
		}
		if c.code != 200 {
			if c.method != "HEAD" && !strings.Contains(rec.Body.String(), "console:") {
				t.Errorf("%s %s: error %q does not say who refused", c.method, c.path, rec.Body)
			}
			continue
		}
		if got := rec.Header().Get("Content-Type"); got != c.ctype {
			t.Errorf("%s %s: content type %q, want %q", c.method, c.path, got, c.ctype)
		}
		if got := rec.Header().Get("Content-Security-Policy"); got != console.CSP {
			t.Errorf("%s %s: CSP %q", c.method, c.path, got)
		}
		etag := rec.Header().Get("ETag")
		req := httptest.NewRequest("GET", c.path, nil)
		req.Header.Set("If-None-Match", etag)
		rec2 := httptest.NewRecorder()
		h.ServeHTTP(rec2, req)
		if etag == "" || rec2.Code != http.StatusNotModified {
			t.Errorf("%s: ETag %q revalidates with %d, want 304", c.path, etag, rec2.Code)
		}
	}
}

// TestNoInlineCode: index.html has no inline script, style or event
// handler attribute, which the CSP would refuse.
func TestNoInlineCode(t *testing.T) {
	rec := httptest.NewRecorder()
	console.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	html := rec.Body.String()
	for _, bad := range []string{"<style", "style=", " onclick=", " onload=", "javascript:", "<script>"} {
		if strings.Contains(html, bad) {
			t.Errorf("index.html contains %q", bad)
		}
	}
	if strings.Count(html, "<script ") != 2 || strings.Contains(html, "http://") || strings.Contains(html, "https://") {
		t.Errorf("index.html should load exactly its own two scripts and nothing from elsewhere")
	}
}

// browser is a headless Chromium tab with every console error, uncaught
// exception and JavaScript dialog recorded.
type browser struct {
	ctx     context.Context
	mu      sync.Mutex
	errs    []string
	dialogs []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		testenv.Skip(t, "no chromium: apt-get install -y chromium")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1440, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &browser{}
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(b.event))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b.ctx = ctx
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1440, 900)); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	go func() {
		// A dialog blocks the page: record it and dismiss it.
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.dialogs = append(b.dialogs, string(ev.Type)+": "+ev.Message)
			b.mu.Unlock()
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return b
}

// event records the page's errors: uncaught exceptions, console.error and
// console.assert calls, and error log entries (CSP violations, failed
// loads).
func (b *browser) event(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		b.errs = append(b.errs, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber+1, msg))
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var parts []string
			for _, a := range ev.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			b.errs = append(b.errs, "console.error: "+strings.Join(parts, " "))
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError {
			b.errs = append(b.errs, fmt.Sprintf("log %s: %s %s", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
		}
	}
}

// problems returns what went wrong in the page so far.
func (b *browser) problems() (errs, dialogs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...), append([]string(nil), b.dialogs...)
}

func (b *browser) do(t *testing.T, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatal(err)
	}
}

// eval evaluates js in the page and returns its value.
func eval[T any](t *testing.T, b *browser, js string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %.80s: %v", js, err)
	}
	return v
}

// waitFor polls js (a boolean expression) until it holds.
func (b *browser) waitFor(t *testing.T, what, js string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !eval[bool](t, b, js) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; the page shows:\n%s", what, timeout, eval[string](t, b, `document.querySelector('main').innerText.slice(0, 3000)`))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setEditor replaces the policy editor's text as typing would.
func (b *browser) setEditor(t *testing.T, text string) {
	t.Helper()
	eval[bool](t, b, `(() => { const a = document.querySelector('#po-editor textarea'); a.value = `+jsString(text)+`; a.dispatchEvent(new Event('input')); return true; })()`)
}

func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	if *screenshots == "" {
		return
	}
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*screenshots, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// jsString quotes s for JavaScript.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// cellOf is a JS expression: the text of column col in the process
// table's row for pid ("" when absent).
func cellOf(pid uint32, col int) string {
	return fmt.Sprintf(`(document.querySelector('#pr-table tbody tr[data-pid="%d"]')?.children[%d]?.textContent ?? '')`, pid, col)
}

// TestConsoleInBrowser drives the console in headless Chromium against
// the real API server and engine: live processes and their states,
// hostile names shown as text, policy errors at their line, a policy
// applied, and the banner when the daemon goes away.
func TestConsoleInBrowser(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	b.do(t, chromedp.Navigate(n.URL+"/#/overview"))

	t.Run("loads", func(t *testing.T) {
		b.waitFor(t, "overview tiles and SLO cards", `document.querySelectorAll('#ov-tiles .tile').length >= 6 && document.querySelectorAll('#ov-slo .slo').length === 2`, 15*time.Second)
		b.waitFor(t, "GPU cards", `document.querySelectorAll('#ov-gpus .gpu').length === 2`, 10*time.Second)
		b.waitFor(t, "data time", `/data at \d\d:\d\d:\d\d/.test(document.getElementById('data-time').textContent)`, 5*time.Second)
		if errs, _ := b.problems(); len(errs) > 0 {
			t.Errorf("errors in the page:\n%s", strings.Join(errs, "\n"))
		}
	})

	t.Run("processes live", func(t *testing.T) {
		b.do(t, chromedp.Navigate(n.URL+"/#/processes"))
		b.waitFor(t, "all six processes", `document.querySelectorAll('#pr-table tbody tr').length === 6`, 10*time.Second)
		// The engine suspends train (201) while an LC request runs on its
		// GPUs and resumes it after; the gate-only process is gated.
		seen := map[string]bool{}
		gated := false
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && !(seen["suspended"] && seen["running"] && gated) {
			st, st203 := eval[string](t, b, cellOf(201, 4)), eval[string](t, b, cellOf(203, 4))
			seen[st] = true
			gated = gated || st203 == "gated"
			time.Sleep(50 * time.Millisecond)
		}
		if !seen["suspended"] || !seen["running"] || !gated {
			t.Errorf("states shown for train: %v; gated seen for pid 203: %v", seen, gated)
		}
		if n.enf.count("suspend 201") == 0 || n.enf.count("gate 203") == 0 {
			t.Errorf("the engine did not suspend 201 and gate 203: %d, %d", n.enf.count("suspend 201"), n.enf.count("gate 203"))
		}
		if weak := eval[string](t, b, cellOf(203, 3)); !strings.Contains(weak, "gate") {
			t.Errorf("pid 203's enforcement cell %q does not say gate", weak)
		}
	})

	t.Run("hostile names are text", func(t *testing.T) {
		if comm := eval[string](t, b, cellOf(203, 1)); comm != hostile[:16] {
			t.Errorf("pid 203's name shown as %q, want %q", comm, hostile[:16])
		}
		b.do(t, chromedp.Click(chromedp.CSS(`#pr-table tbody tr[data-pid="203"]`)))
		b.waitFor(t, "detail with the full command line in the reason", `document.getElementById('pr-detail-body').textContent.includes(`+jsString("batch job: "+hostile)+`)`, 5*time.Second)
		b.waitFor(t, "why weaker", `document.getElementById('pr-detail-body').textContent.includes('no RM client traced for pid 203')`, 5*time.Second)
		b.screenshot(t, "processes")
		b.do(t, chromedp.Navigate(n.URL+"/#/events"))
		b.waitFor(t, "the classification of 203 in the event log", `[...document.querySelectorAll('#ev-table tbody td.reason')].some(td => td.textContent.includes(`+jsString(hostile)+`))`, 5*time.Second)
		b.screenshot(t, "events")
		imgs := eval[int](t, b, `document.querySelectorAll('img:not([src="/static/favicon.svg"])').length`)
		if _, dialogs := b.problems(); imgs != 0 || len(dialogs) != 0 {
			t.Errorf("a name was parsed as HTML: %d foreign img elements, dialogs %q", imgs, dialogs)
		}
	})

	t.Run("charts", func(t *testing.T) {
		b.do(t, chromedp.Navigate(n.URL+"/#/charts"))
		b.waitFor(t, "a latency chart per latency-critical class, best-effort throughput and launch rates", `document.querySelectorAll('.chart .uplot').length === 4 && document.querySelectorAll('#ch-latency .uplot').length === 2`, 10*time.Second)
		b.waitFor(t, "preemption timeline", `!!document.querySelector('#ch-preempt canvas')`, 10*time.Second)
		time.Sleep(4 * time.Second) // a few seconds of series
		b.screenshot(t, "charts")
		eval[bool](t, b, `(document.getElementById('ch-preempt').scrollIntoView({block: 'end'}), true)`)
		b.waitFor(t, "pid 201 suspended on the timeline", `!!document.querySelector('#ch-preempt canvas') && document.querySelector('#ch-preempt canvas').getAttribute('aria-label').startsWith('preemptions of')`, 5*time.Second)
		b.screenshot(t, "timeline")
		b.do(t, chromedp.Navigate(n.URL+"/#/overview"))
		b.screenshot(t, "overview")
	})

	t.Run("policy error at its line", func(t *testing.T) {
		lines := strings.Split(startPolicy, "\n")
		lines[6] = "comm := input.process.comm)" // line 7
		broken := strings.Join(lines, "\n")
		diags, _ := n.pol.Validate(context.Background(), web.PolicyFiles{"policy.rego": []byte(broken)})
		if len(diags) == 0 || diags[0].Row != 7 {
			t.Fatalf("the policy package puts the error at %+v, want line 7", diags)
		}
		b.do(t, chromedp.Navigate(n.URL+"/#/policy"))
		b.waitFor(t, "the file tab", `!!document.querySelector('#po-files button')`, 5*time.Second)
		b.do(t, chromedp.SendKeys(chromedp.ID("po-token"), n.Token), chromedp.Click(chromedp.ID("po-token-save")))
		b.setEditor(t, broken)
		b.do(t, chromedp.Click(chromedp.ID("po-validate")))
		b.waitFor(t, "line 7 marked", `document.querySelector('#po-editor .gutter').children[6].classList.contains('error') && document.querySelectorAll('#po-editor .gutter .error').length === 1`, 10*time.Second)
		b.waitFor(t, "the diagnostic names line 7", `document.getElementById('po-result').textContent.includes('policy.rego:7')`, 5*time.Second)
		b.screenshot(t, "policy")
	})

	t.Run("apply changes a class", func(t *testing.T) {
		changed := strings.Replace(startPolicy, `} else := lib.with_reason(lib.classes["best-effort"]`,
			`} else := object.union(lib.classes["best-effort"], {"class": "training", "priority": 200, "reason": "training jobs"}) if {
	comm == "train"
} else := lib.with_reason(lib.classes["best-effort"]`, 1)
		b.setEditor(t, changed)
		b.do(t, chromedp.Click(chromedp.ID("po-dryrun")))
		b.waitFor(t, "dry run names train", `document.getElementById('po-result').textContent.includes('1 of 6') && document.getElementById('po-result').textContent.includes('training')`, 10*time.Second)
		b.screenshot(t, "policy-dry-run")
		b.do(t, chromedp.Click(chromedp.ID("po-apply")), chromedp.Click(chromedp.ID("po-apply")))
		b.waitFor(t, "applied", `document.getElementById('po-result').textContent.includes('Applied')`, 10*time.Second)
		b.waitFor(t, "two revisions in the history", `document.querySelectorAll('#po-history li').length === 2`, 5*time.Second)
		b.do(t, chromedp.Navigate(n.URL+"/#/processes"))
		b.waitFor(t, "train in class training", cellOf(201, 2)+` === 'training'`, 10*time.Second)
		if errs, _ := b.problems(); len(errs) > 0 {
			t.Errorf("errors in the page:\n%s", strings.Join(errs, "\n"))
		}
	})

	t.Run("stream lost", func(t *testing.T) {
		b.do(t, chromedp.Navigate(n.URL+"/#/overview"))
		b.waitFor(t, "live", `document.getElementById('stream-banner').hidden && document.getElementById('live-dot').classList.contains('live')`, 10*time.Second)
		n.StopServing()
		b.waitFor(t, "the banner", `!document.getElementById('stream-banner').hidden && document.getElementById('stream-banner').textContent.includes('Live stream lost')`, 10*time.Second)
		b.waitFor(t, "the countdown", `/Reconnecting in \d+s \(attempt \d+\)/.test(document.getElementById('stream-banner-text').textContent)`, 10*time.Second)
		b.screenshot(t, "stream-lost")
	})
}
