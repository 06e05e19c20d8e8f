package web

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestTokenFile: made on first start with mode 0600 in a 0700 directory,
// reused after, and refused when others may have read it.
func TestTokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "api.token")
	tok, err := LoadOrCreateToken(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(tok) != 64 {
		t.Errorf("token of %d characters, want 64 hex", len(tok))
	}
	fi, _ := os.Stat(path)
	di, _ := os.Stat(filepath.Dir(path))
	if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
		t.Errorf("token file %v, directory %v", fi.Mode(), di.Mode())
	}
	again, err := LoadOrCreateToken(path)
	if err != nil || !bytes.Equal(again, tok) {
		t.Errorf("second start: %q %v, want the same token", again, err)
	}
	other, _ := LoadOrCreateToken(filepath.Join(t.TempDir(), "api.token"))
	if bytes.Equal(other, tok) {
		t.Error("two token files hold the same token")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateToken(path); err == nil || !strings.Contains(err.Error(), "mode 0644") {
		t.Errorf("world-readable token: %v", err)
	}
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	if _, err := LoadOrCreateToken(short); err == nil || !strings.Contains(err.Error(), "fewer than 32") {
		t.Errorf("short token: %v", err)
	}
	if _, err := New(Options{Snapshots: nil, TokenFile: path}); err == nil {
		t.Error("New without a snapshot source succeeded")
	}
}

// TestSecurityHeaders: every response, API, metrics, probes and errors,
// carries the strict policy; no CORS header is ever sent.
func TestSecurityHeaders(t *testing.T) {
	f := newFixture(t, 2, Limits{})
	for _, p := range []string{"/api/v1/status", "/metrics", "/healthz", "/readyz", "/api/v1/nope", "/api/v1/openapi.yaml"} {
		w := f.do("GET", p, nil, "Origin", "https://evil.example")
		h := w.Header()
		if !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'self'") || h.Get("X-Content-Type-Options") != "nosniff" ||
			h.Get("X-Frame-Options") != "DENY" || h.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s: headers %v", p, h)
		}
		if h.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s: CORS header sent", p)
		}
	}
	if w := f.do("OPTIONS", "/api/v1/policy/apply", nil, "Origin", "https://evil.example", "Access-Control-Request-Method", "POST"); w.Header().Get("Access-Control-Allow-Origin") != "" || w.Header().Get("Access-Control-Allow-Methods") != "" {
		t.Errorf("CORS preflight: %d %v", w.Code, w.Header())
	}
}

// TestCrossOriginRefused: a browser's cross-site POST is refused even
// with the token (which a forging page cannot have anyway).
func TestCrossOriginRefused(t *testing.T) {
	f := newFixture(t, 2, Limits{})
	w := f.do("POST", "/api/v1/policy/validate", `{"files":{"a.rego":"package a"}}`, "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example")
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "cross-origin") {
		t.Errorf("cross-site POST: %d %s", w.Code, w.Body)
	}
}

// TestRateLimit: mutations past the burst get 429 with Retry-After;
// requests without the token and reads are not counted.
func TestRateLimit(t *testing.T) {
	f := newFixture(t, 2, Limits{MutationsPerSecond: 0.001, MutationBurst: 3})
	for range 10 { // requests without the token use none of the budget
		if w := f.do("POST", "/api/v1/policy/rollback", `{"revision":"x"}`, "Authorization", "Bearer nope"); w.Code != 401 {
			t.Fatalf("wrong token: %d", w.Code)
		}
	}
	codes := map[int]int{}
	for range 6 {
		w := f.do("POST", "/api/v1/policy/rollback", `{"revision":"x"}`)
		codes[w.Code]++
		if w.Code == 429 && w.Header().Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
	}
	if codes[404] != 3 || codes[429] != 3 {
		t.Errorf("codes %v, want three 404 then three 429", codes)
	}
	for range 20 {
		if w := f.do("GET", "/api/v1/status", nil); w.Code != 200 {
			t.Fatalf("GET limited: %d", w.Code)
		}
	}
}

// TestServeUnix: the socket is 0600 and the daemon user's; a stale socket
// is replaced, a live one and a regular file are refused, and Shutdown
// removes it.
func TestServeUnix(t *testing.T) {
	f := newFixture(t, 2, Limits{})
	dir := t.TempDir()
	path := filepath.Join(dir, "api.sock")
	// A stale socket: bound, never served, left behind.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	errc := make(chan error, 1)
	go func() { errc <- f.s.ServeUnix(path) }()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	var resp *http.Response
	for i := 0; ; i++ {
		resp, err = client.Get("http://arbiter/api/v1/status")
		if err == nil {
			break
		}
		if i > 200 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status over the socket: %d", resp.StatusCode)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 || int(st.Uid) != os.Geteuid() {
		t.Errorf("socket mode %v uid %d", fi.Mode(), st.Uid)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("staging left behind: %v", entries)
	}

	// A second server on the same path is refused.
	other, err := New(Options{Snapshots: f.eng, TokenFile: filepath.Join(t.TempDir(), "tok"), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Shutdown(context.Background())
	if err := other.ServeUnix(path); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second server on a live socket: %v", err)
	}
	regular := filepath.Join(dir, "file")
	os.WriteFile(regular, nil, 0o600)
	if err := other.ServeUnix(regular); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("serve on a regular file: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Errorf("ServeUnix returned %v after Shutdown", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after Shutdown: %v", err)
	}
}

// TestServeTCPNeedsTLSOffLoopback: the token never crosses a network in
// clear.
func TestServeTCPNeedsTLSOffLoopback(t *testing.T) {
	f := newFixture(t, 1, Limits{})
	for _, addr := range []string{"0.0.0.0:0", ":0", "10.1.2.3:8080", "gpu-node-07:9400"} {
		for _, opts := range []*TCPOptions{nil, {}} {
			if err := f.s.ServeTCP(addr, opts); !errors.Is(err, ErrPlainOffLoopback) || !strings.Contains(err.Error(), "in clear") {
				t.Errorf("%s: %v", addr, err)
			}
		}
	}
}

// TestLoopbackAnswersLocalHostOnly: plain HTTP on a loopback address,
// where reads need no token, answers only to localhost or an IP address
// in Host, so that a page elsewhere cannot read it through a name of its
// own pointed at 127.0.0.1 (DNS rebinding).
func TestLoopbackAnswersLocalHostOnly(t *testing.T) {
	f := newFixture(t, 1, Limits{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- f.s.ServeTCPListener(l, nil) }()
	t.Cleanup(func() {
		_ = f.s.Shutdown(context.Background())
		<-errc
	})
	port := l.Addr().(*net.TCPAddr).Port
	for host, want := range map[string]int{
		fmt.Sprintf("localhost:%d", port):        200,
		fmt.Sprintf("127.0.0.1:%d", port):        200,
		fmt.Sprintf("[::1]:%d", port):            200,
		"localhost.":                             200,
		fmt.Sprintf("evil.example:%d", port):     421,
		fmt.Sprintf("127.0.0.1.nip.io:%d", port): 421,
	} {
		req, _ := http.NewRequest("GET", "http://"+l.Addr().String()+"/api/v1/status", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 421 && !strings.Contains(string(body), "answers to localhost or an IP address only")) {
			t.Errorf("Host %s: %d %s, want %d", host, resp.StatusCode, body, want)
		}
	}
}

// TestHead: HEAD answers as GET without the body on the API and the
// probes, as load balancers and uptime checks send it; not on the event
// stream, which would stream nothing for ever.
func TestHead(t *testing.T) {
	f := newFixture(t, 1, Limits{})
	ts := httptest.NewServer(f.s.Handler())
	t.Cleanup(ts.Close)
	client := &http.Client{Timeout: 5 * time.Second}
	for path, want := range map[string]int{"/healthz": 200, "/api/v1/status": 200, "/metrics": 200, "/api/v1/events": 405, "/api/v1/nope": 404} {
		resp, err := client.Head(ts.URL + path)
		if err != nil {
			t.Fatalf("HEAD %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || len(body) != 0 {
			t.Errorf("HEAD %s: %d with %d bytes of body, want %d and none", path, resp.StatusCode, len(body), want)
		}
	}
}

// TestTurnedAwayNotAnError: a request turned away for now (503: the
// event streams at their limit) is logged at debug, not as an error,
// so that a local client cannot fill the log with errors.
func TestTurnedAwayNotAnError(t *testing.T) {
	f := newFixture(t, 1, Limits{MaxStreams: 1})
	var logged bytes.Buffer
	f.s.log = zerolog.New(&logged).Level(zerolog.InfoLevel)
	ts := httptest.NewServer(f.s.Handler())
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, _ := openStream(t, ctx, ts.URL, "")
	defer resp.Body.Close()
	second, err := http.Get(ts.URL + "/api/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	second.Body.Close()
	if second.StatusCode != http.StatusServiceUnavailable || logged.Len() != 0 {
		t.Errorf("second stream: %d; logged at info or above: %q", second.StatusCode, logged.String())
	}
	if failureLevel(http.StatusInternalServerError) != zerolog.ErrorLevel {
		t.Error("an internal error is not logged as an error")
	}
}
