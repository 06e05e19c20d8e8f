package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/bundletest"
	"github.com/gpu-arbiter/arbiter/policy"
)

// A policy and its Rego test, and one whose test fails.
const (
	goodPolicy = `package arbiter

default_decision := {"class": "best-effort", "preemption": {"mode": "suspend"}}

classify := {"class": "latency-critical", "reason": "vllm"} if input.process.comm == "vllm"
`
	goodTest = `package arbiter_test

import data.arbiter

test_vllm if arbiter.classify.class == "latency-critical" with input.process.comm as "vllm"
`
	failingTest = `package arbiter_test

import data.arbiter

test_vllm if arbiter.classify.class == "latency-critical" with input.process.comm as "vllm"

test_python_is_latency_critical if {
	arbiter.classify.class == "latency-critical" with input.process.comm as "python3"
}
`
)

// good is a bundle at revision rev that passes its tests.
func good(rev string) bundletest.Bundle {
	return bundletest.Bundle{Revision: rev, Modules: map[string]string{"arbiter/policy.rego": goodPolicy, "arbiter/policy_test.rego": goodTest}}
}

// bundleServer is a real HTTP server serving one bundle as OPA's bundle
// servers do: with an ETag, answering 304 to If-None-Match. Its behaviour
// can be changed while it runs.
type bundleServer struct {
	*httptest.Server
	mu       sync.Mutex
	body     []byte
	status   int           // non-zero: answer this instead of the bundle
	delay    time.Duration // wait this long before answering
	token    string        // non-empty: require this bearer token
	chunked  bool          // send no Content-Length
	requests []*http.Request
	answers  []int
}

func newBundleServer(t *testing.T, body []byte) *bundleServer {
	t.Helper()
	s := &bundleServer{body: body}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *bundleServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	body, status, delay, token, chunked := s.body, s.status, s.delay, s.token, s.chunked
	s.requests = append(s.requests, r.Clone(context.Background()))
	s.mu.Unlock()
	code := s.answer(w, r, body, status, delay, token, chunked)
	s.mu.Lock()
	s.answers = append(s.answers, code)
	s.mu.Unlock()
}

func (s *bundleServer) answer(w http.ResponseWriter, r *http.Request, body []byte, status int, delay time.Duration, token string, chunked bool) int {
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return 0
		}
	}
	if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
		http.Error(w, "bad token", http.StatusUnauthorized)
		return http.StatusUnauthorized
	}
	if status != 0 {
		http.Error(w, "bundle store unavailable", status)
		return status
	}
	sum := sha256.Sum256(body)
	etag := `"` + hex.EncodeToString(sum[:8]) + `"`
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return http.StatusNotModified
	}
	w.Header().Set("Content-Type", "application/gzip")
	if chunked {
		w.WriteHeader(http.StatusOK)
		for i := 0; i < len(body); i += 1024 {
			w.Write(body[i:min(i+1024, len(body))])
			w.(http.Flusher).Flush()
		}
		return http.StatusOK
	}
	w.Write(body)
	return http.StatusOK
}

func (s *bundleServer) set(f func(s *bundleServer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// lastAnswer is the status code of the latest answer.
func (s *bundleServer) lastAnswer() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.answers) == 0 {
		return 0
	}
	return s.answers[len(s.answers)-1]
}

func (s *bundleServer) lastRequest() *http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[len(s.requests)-1]
}

// deadURL is a URL where nothing listens: connections are refused.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr + "/bundle.tar.gz"
}

// fallback is an observe-only policy, the one in force before a bundle.
func fallback(t *testing.T) *policy.Policy {
	t.Helper()
	src, err := policy.ReadFS(mapFS(map[string]string{"p.rego": `package arbiter

default_decision := {"class": "unmanaged", "preemption": {"mode": "observe"}, "reason": "no bundle yet"}

classify := default_decision
`}), "fallback", nil)
	if err != nil {
		t.Fatal(err)
	}
	src.Revision = "fallback"
	p, err := policy.New(context.Background(), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// events collects a poller's events.
type events struct {
	mu  sync.Mutex
	evs []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *events) last() Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.evs) == 0 {
		return Event{}
	}
	return e.evs[len(e.evs)-1]
}

func (e *events) all() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.evs...)
}

// start starts a poller on url that polls only when told (Poll is an
// hour) unless opts says otherwise.
func start(t *testing.T, url string, opts Options) (*Poller, *events) {
	t.Helper()
	evs := &events{}
	opts.URL = url
	if opts.Fallback == nil {
		opts.Fallback = fallback(t)
	}
	if opts.Poll == 0 {
		opts.Poll = time.Hour
	}
	opts.OnEvent = evs.add
	p, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, evs
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func mapFS(files map[string]string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for name, body := range files {
		fsys[name] = &fstest.MapFile{Data: []byte(body), Mode: 0o644}
	}
	return fsys
}
