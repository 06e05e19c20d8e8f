package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gpu-arbiter/arbiter/internal/consoletest"
	"github.com/gpu-arbiter/arbiter/web"
	"github.com/gpu-arbiter/arbiter/web/console"
)

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

// TestConsoleInBrowser drives the console in headless Chromium against
// the real API server and engine fed synthetic events: live processes and
// their states, hostile names shown as text, policy errors at their line,
// a policy applied, and the banner when the server goes away. It shows
// what the stub driver cannot (suspension through channel control, two
// GPUs, two SLO classes) and runs without privileges; cmd/arbiter's
// TestDaemonConsoleInBrowser drives it against arbiter run itself and
// takes the screenshots of docs/console.
func TestConsoleInBrowser(t *testing.T) {
	n := startNode(t)
	b := consoletest.New(t)
	b.Do(t, chromedp.Navigate(n.URL+"/#/overview"))

	t.Run("loads", func(t *testing.T) {
		b.WaitFor(t, "overview tiles and SLO cards", `document.querySelectorAll('#ov-tiles .tile').length >= 6 && document.querySelectorAll('#ov-slo .slo').length === 2`, 15*time.Second)
		b.WaitFor(t, "GPU cards", `document.querySelectorAll('#ov-gpus .gpu').length === 2`, 10*time.Second)
		b.WaitFor(t, "data time", `/data at \d\d:\d\d:\d\d/.test(document.getElementById('data-time').textContent)`, 5*time.Second)
		if errs, _ := b.Problems(); len(errs) > 0 {
			t.Errorf("errors in the page:\n%s", strings.Join(errs, "\n"))
		}
	})

	t.Run("processes live", func(t *testing.T) {
		b.Do(t, chromedp.Navigate(n.URL+"/#/processes"))
		b.WaitFor(t, "all six processes", `document.querySelectorAll('#pr-table tbody tr').length === 6`, 10*time.Second)
		// The engine suspends train (201) while an LC request runs on its
		// GPUs and resumes it after; the gate-only process is gated.
		seen := map[string]bool{}
		gated := false
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && !(seen["suspended"] && seen["running"] && gated) {
			st, st203 := consoletest.Eval[string](t, b, consoletest.Cell(201, 4)), consoletest.Eval[string](t, b, consoletest.Cell(203, 4))
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
		if weak := consoletest.Eval[string](t, b, consoletest.Cell(203, 3)); !strings.Contains(weak, "gate") {
			t.Errorf("pid 203's enforcement cell %q does not say gate", weak)
		}
	})

	t.Run("link to a process", func(t *testing.T) {
		b.Do(t, chromedp.Navigate(n.URL+"/#/overview"))
		b.Do(t, chromedp.Navigate(n.URL+"/#/processes/201"))
		b.WaitFor(t, "the detail of pid 201", `!document.getElementById('pr-detail').hidden && document.getElementById('pr-detail-title').textContent.endsWith('· 201')`, 5*time.Second)
		b.Do(t, chromedp.Click(chromedp.ID("pr-detail-close")))
	})

	t.Run("hostile names are text", func(t *testing.T) {
		if comm := consoletest.Eval[string](t, b, consoletest.Cell(203, 1)); comm != hostile[:16] {
			t.Errorf("pid 203's name shown as %q, want %q", comm, hostile[:16])
		}
		b.Click(t, `#pr-table tbody tr[data-pid="203"]`)
		b.WaitFor(t, "detail with the full command line in the reason", `document.getElementById('pr-detail-body').textContent.includes(`+consoletest.JSString("batch job: "+hostile)+`)`, 5*time.Second)
		b.WaitFor(t, "why weaker", `document.getElementById('pr-detail-body').textContent.includes('no RM client traced for pid 203')`, 5*time.Second)
		b.Do(t, chromedp.Navigate(n.URL+"/#/events"))
		b.WaitFor(t, "the classification of 203 in the event log", `[...document.querySelectorAll('#ev-table tbody td.reason')].some(td => td.textContent.includes(`+consoletest.JSString(hostile)+`))`, 5*time.Second)
		imgs := consoletest.Eval[int](t, b, `document.querySelectorAll('img:not([src="/static/favicon.svg"])').length`)
		if _, dialogs := b.Problems(); imgs != 0 || len(dialogs) != 0 {
			t.Errorf("a name was parsed as HTML: %d foreign img elements, dialogs %q", imgs, dialogs)
		}
	})

	t.Run("charts", func(t *testing.T) {
		b.Do(t, chromedp.Navigate(n.URL+"/#/charts"))
		b.WaitFor(t, "a latency chart per latency-critical class, best-effort throughput and launch rates", `document.querySelectorAll('.chart .uplot').length === 4 && document.querySelectorAll('#ch-latency .uplot').length === 2`, 10*time.Second)
		b.WaitFor(t, "preemption timeline", `!!document.querySelector('#ch-preempt canvas')`, 10*time.Second)
		consoletest.Eval[bool](t, b, `(document.getElementById('ch-preempt').scrollIntoView({block: 'end'}), true)`)
		b.WaitFor(t, "pid 201 suspended on the timeline", `!!document.querySelector('#ch-preempt canvas') && document.querySelector('#ch-preempt canvas').getAttribute('aria-label').startsWith('preemptions of')`, 5*time.Second)
		b.Do(t, chromedp.Navigate(n.URL+"/#/overview"))
	})

	t.Run("policy error at its line", func(t *testing.T) {
		lines := strings.Split(startPolicy, "\n")
		lines[6] = "comm := input.process.comm)" // line 7
		broken := strings.Join(lines, "\n")
		diags, _ := n.pol.Validate(context.Background(), web.PolicyFiles{"policy.rego": []byte(broken)})
		if len(diags) == 0 || diags[0].Row != 7 {
			t.Fatalf("the policy package puts the error at %+v, want line 7", diags)
		}
		b.Do(t, chromedp.Navigate(n.URL+"/#/policy"))
		b.WaitFor(t, "the file tab", `!!document.querySelector('#po-files button')`, 5*time.Second)
		b.Do(t, chromedp.SendKeys(chromedp.ID("po-token"), n.Token), chromedp.Click(chromedp.ID("po-token-save")))
		b.SetEditor(t, broken)
		b.Do(t, chromedp.Click(chromedp.ID("po-validate")))
		b.WaitFor(t, "line 7 marked", `document.querySelector('#po-editor .gutter').children[6].classList.contains('error') && document.querySelectorAll('#po-editor .gutter .error').length === 1`, 10*time.Second)
		b.WaitFor(t, "the diagnostic names line 7", `document.getElementById('po-result').textContent.includes('policy.rego:7')`, 5*time.Second)
	})

	t.Run("apply changes a class", func(t *testing.T) {
		changed := strings.Replace(startPolicy, `} else := lib.with_reason(lib.classes["best-effort"]`,
			`} else := object.union(lib.classes["best-effort"], {"class": "training", "priority": 200, "reason": "training jobs"}) if {
	comm == "train"
} else := lib.with_reason(lib.classes["best-effort"]`, 1)
		b.SetEditor(t, changed)
		b.Do(t, chromedp.Click(chromedp.ID("po-dryrun")))
		b.WaitFor(t, "dry run names train", `document.getElementById('po-result').textContent.includes('1 of 6') && document.getElementById('po-result').textContent.includes('training')`, 10*time.Second)
		b.Do(t, chromedp.Click(chromedp.ID("po-apply")), chromedp.Click(chromedp.ID("po-apply")))
		b.WaitFor(t, "applied", `document.getElementById('po-result').textContent.includes('Applied')`, 10*time.Second)
		b.WaitFor(t, "two revisions in the history", `document.querySelectorAll('#po-history li').length === 2`, 5*time.Second)
		b.Do(t, chromedp.Navigate(n.URL+"/#/processes"))
		b.WaitFor(t, "train in class training", consoletest.Cell(201, 2)+` === 'training'`, 10*time.Second)
		if errs, _ := b.Problems(); len(errs) > 0 {
			t.Errorf("errors in the page:\n%s", strings.Join(errs, "\n"))
		}
	})

	t.Run("read-only policy", func(t *testing.T) {
		n.pol.setReadOnly("the daemon runs the embedded default policy: start it with --policy DIR")
		defer n.pol.setReadOnly("")
		b.Do(t, chromedp.Navigate(n.URL+"/#/policy"), chromedp.Reload())
		b.WaitFor(t, "the read-only note", `document.getElementById('po-result').textContent.includes('Read only: the daemon runs the embedded default policy')`, 10*time.Second)
		if !consoletest.Eval[bool](t, b, `document.getElementById('po-apply').disabled`) {
			t.Error("Apply is enabled on a policy the daemon does not change through the API")
		}
	})

	t.Run("stream lost", func(t *testing.T) {
		b.Do(t, chromedp.Navigate(n.URL+"/#/overview"))
		b.WaitFor(t, "live", `document.getElementById('stream-banner').hidden && document.getElementById('live-dot').classList.contains('live')`, 10*time.Second)
		n.StopServing()
		b.WaitFor(t, "the banner", `!document.getElementById('stream-banner').hidden && document.getElementById('stream-banner').textContent.includes('Live stream lost')`, 10*time.Second)
		b.WaitFor(t, "the countdown", `/Reconnecting in \d+s \(attempt \d+\)/.test(document.getElementById('stream-banner-text').textContent)`, 10*time.Second)
	})
}
