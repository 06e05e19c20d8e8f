// Package consoletest drives the web console in headless Chromium for
// tests, through the DevTools protocol (chromedp): it records every error
// the page reports and every JavaScript dialog it opens, evaluates
// expressions in the page, waits for conditions, and saves screenshots.
// It knows the console's own markup where tests need it: the process
// table's cells and the policy editor.
package consoletest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// Browser is a headless Chromium tab with every console error, uncaught
// exception and JavaScript dialog recorded.
type Browser struct {
	ctx      context.Context
	mu       sync.Mutex
	errs     []string
	dialogs  []string
	requests []string       // URLs the page asked for
	stream   map[string]int // Server-Sent Events received, by event name
}

// New starts Chromium (Debian's chromium, chromium-browser or
// google-chrome, whichever is on PATH) with a 1440×900 window; the test's
// end stops it. Without a browser the test is skipped (failed where
// ARBITER_REQUIRE_BPF=1 says CI must run everything).
func New(t *testing.T) *Browser {
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
	b := &Browser{stream: map[string]int{}}
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

// event records the page's errors (uncaught exceptions, console.error
// and console.assert calls, error log entries: CSP violations, failed
// loads), its requests and the stream events it receives.
func (b *Browser) event(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.requests = append(b.requests, ev.Request.URL)
	case *network.EventEventSourceMessageReceived:
		b.stream[ev.EventName]++
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

// Problems returns the errors the page reported and the dialogs it opened
// so far.
func (b *Browser) Problems() (errs, dialogs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...), append([]string(nil), b.dialogs...)
}

// Requests returns the URLs the page asked for so far.
func (b *Browser) Requests() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.requests...)
}

// StreamEvents returns how many Server-Sent Events of the given name the
// page received so far.
func (b *Browser) StreamEvents(name string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stream[name]
}

// CheckErrors fails t with the errors the page reported so far.
func (b *Browser) CheckErrors(t *testing.T) {
	t.Helper()
	if errs, _ := b.Problems(); len(errs) > 0 {
		t.Errorf("errors in the page:\n%s", strings.Join(errs, "\n"))
	}
}

// Do runs actions in the tab, failing t after 30 s.
func (b *Browser) Do(t *testing.T, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatal(err)
	}
}

// Eval evaluates js in the page and returns its value.
func Eval[T any](t *testing.T, b *Browser, js string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %.80s: %v", js, err)
	}
	return v
}

// minWait is the least WaitFor waits: a browser on a loaded machine can
// take seconds to draw what it draws in milliseconds on an idle one.
const minWait = 20 * time.Second

// WaitFor polls js (a boolean expression) until it holds, failing t with
// what the page shows when it does not within timeout (never less than
// minWait; it returns as soon as js holds).
func (b *Browser) WaitFor(t *testing.T, what, js string, timeout time.Duration) {
	t.Helper()
	timeout = max(timeout, minWait)
	deadline := time.Now().Add(timeout)
	for !Eval[bool](t, b, js) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; the page shows:\n%s", what, timeout, Eval[string](t, b, `document.querySelector('main').innerText.slice(0, 3000)`))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Click clicks the element sel selects, found and clicked in the page in
// one step, waiting for it to exist as WaitFor does: a table the console
// redraws live can replace a row between a click by node
// (chromedp.Click) finding it and clicking it, which then fails with
// "Could not find node with given id".
func (b *Browser) Click(t *testing.T, sel string) {
	t.Helper()
	b.WaitFor(t, "something to click at "+sel, `(() => { const e = document.querySelector(`+JSString(sel)+`); if (!e) return false; e.click(); return true; })()`, 5*time.Second)
}

// Screenshot saves the viewport as dir/name.png, once what is drawing has
// settled; nothing when dir is "".
func (b *Browser) Screenshot(t *testing.T, dir, name string) {
	t.Helper()
	if dir == "" {
		return
	}
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// SetEditor replaces the policy editor's text as typing would.
func (b *Browser) SetEditor(t *testing.T, text string) {
	t.Helper()
	Eval[bool](t, b, `(() => { const a = document.querySelector('#po-editor textarea'); a.value = `+JSString(text)+`; a.dispatchEvent(new Event('input')); return true; })()`)
}

// JSString quotes s for JavaScript.
func JSString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Process table columns, for Cell.
const (
	ColPID = iota
	ColName
	ColClass
	ColLevel
	ColState
)

// Cell is a JS expression: the text of column col in the process table's
// row for pid ("" when the row is absent).
func Cell(pid int, col int) string {
	return fmt.Sprintf(`(document.querySelector('#pr-table tbody tr[data-pid="%d"]')?.children[%d]?.textContent ?? '')`, pid, col)
}
