package fetch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/gpu-arbiter/arbiter/policy"
)

// Defaults of Options.
const (
	DefaultPoll       = time.Minute
	DefaultTimeout    = 30 * time.Second
	DefaultMaxBytes   = 16 << 20
	DefaultMinBackoff = time.Second
)

// Options configure a Poller.
type Options struct {
	// URL is the bundle's http or https URL (required).
	URL string
	// Verification, when set, requires every bundle to be signed with its
	// key (LoadKey); nil reads bundles without checking a signature.
	Verification *bundle.VerificationConfig
	// TokenFile, when set, holds a bearer token sent to the server; it is
	// read at every request.
	TokenFile string
	// Poll is the least wait between two polls; each wait adds up to half
	// of it again at random. Default DefaultPoll.
	Poll time.Duration
	// Timeout bounds one request, the download included. Default
	// DefaultTimeout.
	Timeout time.Duration
	// MaxBytes bounds the download; a bigger bundle is refused while it is
	// read. Default DefaultMaxBytes.
	MaxBytes int64
	// MinBackoff is the wait after a first failed fetch; it doubles with
	// each failure in a row, up to MaxBackoff (default Poll).
	MinBackoff, MaxBackoff time.Duration
	// SaveFile, when set, is where the last good bundle is kept (mode
	// 0600), so that a later run starts on it, checked again, until the
	// server answers.
	SaveFile string
	// Fallback is the policy in force until a bundle passes (required).
	Fallback *policy.Policy
	// Policy are the options of every policy load and check.
	Policy *policy.Options
	// OnEvent, when set, is called after every fetch, from the goroutine
	// that made it.
	OnEvent func(Event)
	// Client makes the requests; nil: a client of its own, with the
	// environment's proxy settings.
	Client *http.Client
	// UserAgent is sent with every request. Default "arbiter".
	UserAgent string
}

// Poller keeps the policy of a bundle URL in force.
type Poller struct {
	opts   Options
	client *client
	name   string // the bundle's name in policy messages
	cur    atomic.Pointer[policy.Policy]

	fetching sync.Mutex // serialises fetches; guards etag
	etag     string
	mu       sync.Mutex // guards status, never held over a request
	status   Status

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	closed sync.Once
}

// New checks opts, starts on the saved bundle when there is a good one
// (else on the fallback), fetches the bundle once, and then polls in the
// background until Close. A server that cannot be reached at start is no
// error: the Status and the Event say so, and the poller retries.
func New(ctx context.Context, opts Options) (*Poller, error) {
	u, err := checkURL(opts.URL)
	if err != nil {
		return nil, err
	}
	if opts.Fallback == nil {
		return nil, errors.New("bundle poller: no fallback policy")
	}
	opts = opts.withDefaults()
	hc := opts.Client
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	p := &Poller{opts: opts, name: u.Host + u.EscapedPath(), done: make(chan struct{}),
		client: &client{url: opts.URL, http: hc, tokenFile: opts.TokenFile, timeout: opts.Timeout, maxBytes: opts.MaxBytes, userAgent: opts.UserAgent}}
	p.status = Status{URL: u.Redacted(), Origin: OriginFallback, SignatureRequired: opts.Verification != nil,
		Fetches: map[Result]uint64{}, Failures: map[Reason]uint64{}}
	p.cur.Store(opts.Fallback)
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.restore(ctx)
	next := p.Poll(ctx)
	go p.loop(next)
	return p, nil
}

// Policy returns the policy in force. It never returns nil.
func (p *Poller) Policy() *policy.Policy { return p.cur.Load() }

// Status returns the current status.
func (p *Poller) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status.clone()
}

// Close stops polling and waits for a fetch in flight to end; the policy
// in force stays readable.
func (p *Poller) Close() error {
	p.closed.Do(func() {
		p.cancel()
		<-p.done
	})
	return nil
}

func (p *Poller) loop(next time.Duration) {
	defer close(p.done)
	t := time.NewTimer(next)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
			t.Reset(p.Poll(p.ctx))
		}
	}
}

// Poll fetches the bundle now, activates it if it is new and passes, and
// returns the wait until the next fetch. The background polling goes on
// at its own times.
func (p *Poller) Poll(ctx context.Context) time.Duration {
	ev, ok := p.pollLocked(ctx)
	if !ok {
		return p.opts.Poll // stopped, not failed
	}
	p.notify(ev)
	return ev.Next
}

func (p *Poller) pollLocked(ctx context.Context) (Event, bool) {
	p.fetching.Lock()
	defer p.fetching.Unlock()
	if p.ctx.Err() != nil {
		return Event{}, false
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel) // Close ends a fetch in flight
	defer stop()
	ev := p.fetch(ctx)
	if ctx.Err() != nil && ev.Result == ResultFailed {
		return Event{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.record(ev), true
}

// notify tells the caller, outside the lock, so that OnEvent may read the
// Status.
func (p *Poller) notify(ev Event) {
	if p.opts.OnEvent != nil {
		p.opts.OnEvent(ev)
	}
}

// fetch makes one request and takes its answer.
func (p *Poller) fetch(ctx context.Context) Event {
	ans, err := p.client.get(ctx, p.etag)
	if err != nil {
		var pr *problem
		errors.As(err, &pr)
		ev := Event{Result: ResultFailed, Reason: pr.reason, Err: pr.err}
		if pr.reason == ReasonTooLarge {
			ev.Result = ResultRejected
		}
		return ev
	}
	if ans.notModified {
		return Event{Result: ResultNotModified, ETag: ans.etag}
	}
	p.etag = ans.etag
	ev := Event{ETag: ans.etag}
	src, err := policy.ReadBundle(p.name, ans.body, &policy.BundleOptions{Verification: p.opts.Verification}, p.opts.Policy)
	if err != nil {
		ev.Result, ev.Reason, ev.Err = ResultRejected, reasonOf(err), err
		return ev
	}
	ev.Revision, ev.Signature = src.Revision, src.Signature
	st := p.Status()
	switch {
	case st.Origin != OriginFallback && src.Revision == st.Revision:
		ev.Result = ResultUnchanged
		return ev
	case src.Revision == st.LastErrorRevision:
		// The same refused revision again: the same verdict, without
		// checking it again.
		ev.Result, ev.Reason = ResultRejected, st.LastErrorReason
		ev.Err = &policy.Error{Source: p.name, Revision: src.Revision, Diagnostics: st.LastErrorDiagnostics}
		return ev
	}
	pol, err := policy.Check(ctx, src, p.opts.Policy)
	if err != nil {
		ev.Result, ev.Reason, ev.Err = ResultRejected, reasonOf(err), err
		return ev
	}
	ev.Result, ev.Policy = ResultActivated, pol
	if err := p.save(ans.body); err != nil {
		ev.Err = err // activated all the same; the caller hears it could not be kept
	}
	return ev
}

// record applies ev to the status, swaps its policy in and schedules the
// next fetch; it returns ev with its wait and failure count set. The
// caller holds mu.
func (p *Poller) record(ev Event) Event {
	now := time.Now()
	st := &p.status
	if !ev.Saved {
		st.LastFetchAt, st.LastResult = now, ev.Result
		st.Fetches[ev.Result]++
	}
	if ev.Result == ResultFailed {
		st.ConsecutiveFailures++
		st.LastFetchError = ev.Err.Error()
		ev.Failures = st.ConsecutiveFailures
		ev.Next = backoff(st.ConsecutiveFailures, p.opts.MinBackoff, p.opts.MaxBackoff)
	} else {
		if !ev.Saved {
			st.ConsecutiveFailures, st.LastFetchError, st.LastSuccessAt = 0, "", now
		}
		ev.Next = pollDelay(p.opts.Poll)
	}
	if ev.Reason != "" {
		st.Failures[ev.Reason]++
	}
	switch ev.Result {
	case ResultActivated:
		p.cur.Store(ev.Policy)
		st.Origin = OriginBundle
		if ev.Saved {
			st.Origin = OriginSaved
		}
		st.Revision, st.ETag, st.Signature, st.ActivatedAt = ev.Revision, ev.ETag, ev.Signature, now
		st.Activations++
		st.clearError()
	case ResultUnchanged:
		st.Origin, st.ETag = OriginBundle, ev.ETag
		st.clearError()
	case ResultRejected:
		st.Rejections++
		st.LastError, st.LastErrorAt, st.LastErrorReason, st.LastErrorRevision = ev.Err.Error(), now, ev.Reason, ev.Revision
		st.LastErrorDiagnostics = policy.Diagnostics(ev.Err)
		if ev.Saved {
			st.LastErrorRevision = "" // the server's copy of it may be whole
		}
	}
	if !ev.Saved {
		st.NextFetchAt = now.Add(ev.Next)
	}
	ev.InForce = p.cur.Load().Revision()
	return ev
}

// restore starts on the bundle an earlier run saved, if it still passes
// every check (the key may have changed since).
func (p *Poller) restore(ctx context.Context) {
	if p.opts.SaveFile == "" {
		return
	}
	data, err := os.ReadFile(p.opts.SaveFile)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	ev := Event{Saved: true}
	if err == nil && int64(len(data)) > p.opts.MaxBytes {
		err = fmt.Errorf("%s is over %d bytes", p.opts.SaveFile, p.opts.MaxBytes)
	}
	var src *policy.Source
	if err == nil {
		src, err = policy.ReadBundle(p.name, data, &policy.BundleOptions{Verification: p.opts.Verification}, p.opts.Policy)
	}
	var pol *policy.Policy
	if err == nil {
		ev.Revision, ev.Signature = src.Revision, src.Signature
		pol, err = policy.Check(ctx, src, p.opts.Policy)
	}
	if err != nil {
		ev.Result, ev.Reason, ev.Err = ResultRejected, reasonOf(err), fmt.Errorf("the bundle saved by an earlier run (%s): %w", p.opts.SaveFile, err)
	} else {
		ev.Result, ev.Policy = ResultActivated, pol
	}
	p.mu.Lock()
	ev = p.record(ev)
	p.mu.Unlock()
	p.notify(ev)
}

// save keeps the bundle just activated for the next run: written beside
// its name and renamed over it, so that a crash leaves the old one or the
// new one, never a part.
func (p *Poller) save(data []byte) error {
	if p.opts.SaveFile == "" {
		return nil
	}
	dir := filepath.Dir(p.opts.SaveFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save the bundle: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(p.opts.SaveFile)+".*")
	if err != nil {
		return fmt.Errorf("save the bundle: %w", err)
	}
	_, werr := tmp.Write(data)
	if err := errors.Join(werr, tmp.Sync(), tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("save the bundle to %s: %w", p.opts.SaveFile, err)
	}
	if err := os.Rename(tmp.Name(), p.opts.SaveFile); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("save the bundle to %s: %w", p.opts.SaveFile, err)
	}
	return nil
}

func checkURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, fmt.Errorf("bundle URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("bundle URL %q: want an http:// or https:// URL", u.Redacted())
	case u.Host == "":
		return nil, fmt.Errorf("bundle URL %q: no host", u.Redacted())
	}
	return u, nil
}

func (o Options) withDefaults() Options {
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = o.Poll
	}
	o.MaxBackoff = max(o.MaxBackoff, o.MinBackoff)
	if o.UserAgent == "" {
		o.UserAgent = "arbiter"
	}
	return o
}
