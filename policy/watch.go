package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long the watcher waits for a directory to settle.
const DefaultDebounce = 200 * time.Millisecond

// WatchOptions tune a Watcher; nil means defaults.
type WatchOptions struct {
	// Policy options for every load.
	Policy *Options
	// Debounce is the quiet time after the last change before a reload.
	Debounce time.Duration
	// OnReload is called after every reload attempt that found new content,
	// with the error that kept the old policy (nil when swapped).
	OnReload func(*Policy, error)
}

// Status says which policy is applied and how the last reload went.
type Status struct {
	// Revision of the policy in force, and when it was loaded.
	Revision string    `json:"revision"`
	LoadedAt time.Time `json:"loaded_at"`
	// LastError is why the most recent attempt was rejected; empty when it
	// was applied. LastErrorRevision is the rejected content.
	LastError         string    `json:"last_error,omitempty"`
	LastErrorAt       time.Time `json:"last_error_at,omitzero"`
	LastErrorRevision string    `json:"last_error_revision,omitempty"`
	Reloads           int       `json:"reloads"`
	Rejected          int       `json:"rejected"`
	// Evaluator is how the policy in force is evaluated (plan or topdown);
	// EvaluatorNote says why not by its compiled plan.
	Evaluator     Evaluator `json:"evaluator"`
	EvaluatorNote string    `json:"evaluator_note,omitempty"`
}

// statusOf is the status of a freshly applied policy.
func statusOf(p *Policy, reloads, rejected int) *Status {
	st := &Status{Revision: p.Revision(), LoadedAt: time.Now(), Reloads: reloads, Rejected: rejected}
	var why error
	if st.Evaluator, why = p.Evaluator(); why != nil {
		st.EvaluatorNote = why.Error()
	}
	return st
}

// Watcher keeps the policy of a directory loaded: it watches the directory
// itself (editors and ConfigMap volumes replace files rather than write
// them), waits for changes to settle, and swaps in the new policy only if it
// loads, checks and passes its own Rego tests. Otherwise the last good
// policy stays in force and Status says why.
type Watcher struct {
	dir    string
	opts   WatchOptions
	fsw    *fsnotify.Watcher
	cur    atomic.Pointer[Policy]
	status atomic.Pointer[Status]
	mu     sync.Mutex // serialises reloads
	done   chan struct{}
	closed sync.Once
	wg     sync.WaitGroup
}

// Watch loads the policy in dir (a directory or a .tar.gz bundle), which
// must be good, and starts watching.
func Watch(ctx context.Context, dir string, opts *WatchOptions) (*Watcher, error) {
	w := &Watcher{dir: dir, done: make(chan struct{})}
	if opts != nil {
		w.opts = *opts
	}
	if w.opts.Debounce <= 0 {
		w.opts.Debounce = DefaultDebounce
	}
	p, err := w.build(ctx)
	if err != nil {
		return nil, err
	}
	w.cur.Store(p)
	w.status.Store(statusOf(p, 0, 0))
	if w.fsw, err = fsnotify.NewWatcher(); err != nil {
		return nil, fmt.Errorf("watch policy %s: %w", dir, err)
	}
	if err := w.addWatches(); err != nil {
		w.fsw.Close()
		return nil, err
	}
	w.wg.Add(1)
	go w.loop()
	return w, nil
}

// addWatches watches the policy directory and its visible subdirectories,
// or, for a bundle, the directory holding it (bundles are replaced, not
// rewritten in place, by every tool that ships them).
func (w *Watcher) addWatches() error {
	if fi, err := os.Stat(w.dir); err == nil && !fi.IsDir() {
		if err := w.fsw.Add(filepath.Dir(w.dir)); err != nil {
			return fmt.Errorf("watch policy bundle %s: %w", w.dir, err)
		}
		return nil
	}
	return filepath.WalkDir(w.dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != w.dir && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if err := w.fsw.Add(p); err != nil {
			return fmt.Errorf("watch policy %s: %w", p, err)
		}
		return nil
	})
}

// Policy returns the policy in force. It never returns nil.
func (w *Watcher) Policy() *Policy { return w.cur.Load() }

// Status returns the current status.
func (w *Watcher) Status() Status { return *w.status.Load() }

// Close stops watching; the policy in force stays readable.
func (w *Watcher) Close() error {
	var err error
	w.closed.Do(func() {
		close(w.done)
		err = w.fsw.Close()
		w.wg.Wait()
	})
	return err
}

func (w *Watcher) loop() {
	defer w.wg.Done()
	var timer *time.Timer
	var fire <-chan time.Time
	for {
		select {
		case <-w.done:
			if timer != nil {
				timer.Stop()
			}
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Stat(ev.Name); err == nil && fi.IsDir() && !strings.HasPrefix(filepath.Base(ev.Name), ".") {
					_ = w.fsw.Add(ev.Name) // a new subdirectory; failure shows as a missed reload
				}
			}
			if timer == nil {
				timer = time.NewTimer(w.opts.Debounce)
			} else {
				timer.Reset(w.opts.Debounce)
			}
			fire = timer.C
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			w.reject("", fmt.Errorf("watch policy %s: %w", w.dir, err))
		case <-fire:
			fire = nil
			_ = w.Reload(context.Background())
		}
	}
}

// Reload reloads now. It returns nil when the new content was applied or
// was the same as what is in force, else the error that kept the old one.
func (w *Watcher) Reload(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	src, err := Read(w.dir, w.opts.Policy)
	rev := revisionOf(src, err)
	if rev != "" && rev == w.cur.Load().Revision() {
		// The directory holds what is in force again (a broken change
		// undone): the rejection is over.
		if old := w.status.Load(); old.LastError != "" {
			st := *old
			st.LastError, st.LastErrorAt, st.LastErrorRevision = "", time.Time{}, ""
			w.status.Store(&st)
		}
		return nil
	}
	if st := w.status.Load(); rev != "" && rev == st.LastErrorRevision {
		return errors.New(st.LastError) // the same broken content again
	}
	var p *Policy
	if err == nil {
		p, err = w.check(ctx, src)
	}
	if err != nil {
		w.reject(rev, err)
		w.notify(nil, err)
		return err
	}
	w.cur.Store(p)
	old := w.status.Load()
	w.status.Store(statusOf(p, old.Reloads+1, old.Rejected))
	w.notify(p, nil)
	return nil
}

func revisionOf(src *Source, err error) string {
	if src != nil {
		return src.Revision
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Revision
	}
	return ""
}

func (w *Watcher) notify(p *Policy, err error) {
	if w.opts.OnReload != nil {
		w.opts.OnReload(p, err)
	}
}

func (w *Watcher) reject(rev string, err error) {
	old := w.status.Load()
	st := *old
	st.LastError, st.LastErrorAt, st.LastErrorRevision = err.Error(), time.Now(), rev
	st.Rejected++
	w.status.Store(&st)
}

func (w *Watcher) build(ctx context.Context) (*Policy, error) {
	src, err := Read(w.dir, w.opts.Policy)
	if err != nil {
		return nil, err
	}
	return w.check(ctx, src)
}

// check loads src and runs its Rego tests, as Check.
func (w *Watcher) check(ctx context.Context, src *Source) (*Policy, error) {
	return Check(ctx, src, w.opts.Policy)
}

// Check compiles and checks src (New) and runs its Rego tests: what a
// Watcher does before it swaps a policy in. A policy with failing tests is
// as broken as one that does not compile; the error is an *Error with a
// diagnostic per failed test at its file and row. A policy without tests
// passes.
func Check(ctx context.Context, src *Source, opts *Options) (*Policy, error) {
	p, err := New(ctx, src, opts)
	if err != nil {
		return nil, err
	}
	rep, err := Test(ctx, src, nil)
	if err != nil {
		return nil, err
	}
	if rep.Failed > 0 || rep.Errored > 0 {
		var diags []Diagnostic
		for _, r := range rep.Results {
			if r.Outcome == "fail" || r.Outcome == "error" {
				msg := fmt.Sprintf("test %s.%s: %s", r.Package, r.Name, r.Outcome)
				if r.Error != "" {
					msg += ": " + r.Error
				}
				diags = append(diags, Diagnostic{Code: CodeTest, File: r.File, Row: r.Row, Message: msg})
			}
		}
		return nil, &Error{Source: src.Name, Diagnostics: diags}
	}
	return p, nil
}
