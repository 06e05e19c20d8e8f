package fetch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/bundletest"
	"github.com/gpu-arbiter/arbiter/policy"
)

// TestActivatesAndPollsWithETag: a good bundle is in force after New, its
// revision in the status; the next poll sends its ETag and the 304 keeps
// it; a new revision activates.
func TestActivatesAndPollsWithETag(t *testing.T) {
	srv := newBundleServer(t, good("r1").Build(t))
	p, evs := start(t, srv.URL+"/bundles/arbiter.tar.gz", Options{})
	st := p.Status()
	if p.Policy().Revision() != "r1" || st.Origin != OriginBundle || st.Revision != "r1" || st.Activations != 1 ||
		st.Signature != policy.SignatureUnsigned || st.ETag == "" || st.LastSuccessAt.IsZero() {
		t.Fatalf("after start: policy %s, status %+v", p.Policy().Revision(), st)
	}
	if ev := evs.last(); ev.Result != ResultActivated || ev.Revision != "r1" || ev.Policy == nil || ev.InForce != "r1" {
		t.Fatalf("event %+v", ev)
	}
	p.Poll(context.Background())
	if got := srv.lastRequest().Header.Get("If-None-Match"); got != st.ETag || srv.lastAnswer() != http.StatusNotModified {
		t.Fatalf("If-None-Match %q (ETag %q), answer %d", got, st.ETag, srv.lastAnswer())
	}
	if ev := evs.last(); ev.Result != ResultNotModified || p.Policy().Revision() != "r1" {
		t.Fatalf("304: event %+v, policy %s", ev, p.Policy().Revision())
	}
	srv.set(func(s *bundleServer) { s.body = good("r2").Build(t) })
	p.Poll(context.Background())
	st = p.Status()
	if p.Policy().Revision() != "r2" || st.Activations != 2 || st.Fetches[ResultNotModified] != 1 || st.Fetches[ResultActivated] != 2 {
		t.Fatalf("after r2: %s %+v", p.Policy().Revision(), st)
	}
	// The same revision rebuilt (another ETag, same content) is no change.
	srv.set(func(s *bundleServer) {
		b := good("r2")
		b.Data = map[string]any{"note": "rebuilt"}
		s.body = b.Build(t)
	})
	p.Poll(context.Background())
	if ev := evs.last(); ev.Result != ResultUnchanged || p.Status().Activations != 2 {
		t.Fatalf("rebuilt r2: %+v", ev)
	}
	if ua := srv.lastRequest().Header.Get("User-Agent"); ua != "arbiter" {
		t.Errorf("User-Agent %q", ua)
	}
}

// TestRejectsBundleFailingItsTests: a bundle whose Rego tests fail is
// refused with the test's file and row; the last good policy stays, and
// the status and event say why. The server answering 304 to the refused
// bundle's ETag changes nothing; a fixed bundle activates and clears the
// error.
func TestRejectsBundleFailingItsTests(t *testing.T) {
	srv := newBundleServer(t, good("r1").Build(t))
	p, evs := start(t, srv.URL+"/b.tar.gz", Options{})
	bad := good("r2-bad")
	bad.Modules["arbiter/policy_test.rego"] = failingTest
	srv.set(func(s *bundleServer) { s.body = bad.Build(t) })
	p.Poll(context.Background())
	ev := evs.last()
	if ev.Result != ResultRejected || ev.Reason != ReasonTests || ev.Revision != "r2-bad" || ev.ETag == "" || ev.InForce != "r1" {
		t.Fatalf("event %+v", ev)
	}
	var pe *policy.Error
	if !errors.As(ev.Err, &pe) || pe.Diagnostics[0].Code != policy.CodeTest ||
		!strings.Contains(ev.Err.Error(), "arbiter/policy_test.rego:7") || !strings.Contains(ev.Err.Error(), "test_python_is_latency_critical") {
		t.Fatalf("error %v", ev.Err)
	}
	st := p.Status()
	if d := st.LastErrorDiagnostics; len(d) != 1 || d[0].Code != policy.CodeTest || d[0].Row != 7 || !strings.HasSuffix(d[0].File, "arbiter/policy_test.rego") {
		t.Errorf("diagnostics %+v", d)
	}
	if p.Policy().Revision() != "r1" || st.Revision != "r1" || st.LastErrorRevision != "r2-bad" || st.LastErrorReason != ReasonTests ||
		st.Rejections != 1 || st.Failures[ReasonTests] != 1 || !strings.Contains(st.LastError, "test_python_is_latency_critical") {
		t.Fatalf("policy %s, status %+v", p.Policy().Revision(), st)
	}
	p.Poll(context.Background())
	if ev := evs.last(); ev.Result != ResultNotModified || p.Status().LastError == "" {
		t.Fatalf("304 after a refused bundle: %+v %+v", ev, p.Status())
	}
	// A server that rebuilds the refused revision gets the same verdict.
	srv.set(func(s *bundleServer) {
		bad.Data = map[string]any{"rebuilt": true}
		s.body = bad.Build(t)
	})
	p.Poll(context.Background())
	if ev := evs.last(); ev.Result != ResultRejected || ev.Reason != ReasonTests || p.Policy().Revision() != "r1" ||
		ev.Err.Error() != st.LastError || len(p.Status().LastErrorDiagnostics) != 1 {
		t.Fatalf("refused revision again: %+v\nwant the error %s", ev, st.LastError)
	}
	srv.set(func(s *bundleServer) { s.body = good("r3").Build(t) })
	p.Poll(context.Background())
	if st := p.Status(); p.Policy().Revision() != "r3" || st.LastError != "" || st.LastErrorRevision != "" {
		t.Fatalf("fixed: %s %+v", p.Policy().Revision(), st)
	}
}

// TestSignedBundles: with a key, only a bundle signed with it activates;
// an unsigned one, a tampered one and one signed with another key are
// refused for their signature, before and after a good one.
func TestSignedBundles(t *testing.T) {
	key, other := bundletest.RSAKey(t), bundletest.RSAKey(t)
	keyFile := filepath.Join(t.TempDir(), "bundle.pub")
	if err := os.WriteFile(keyFile, []byte(key.Public), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := LoadKey(KeyOptions{File: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	srv := newBundleServer(t, good("r1").Build(t))
	p, evs := start(t, srv.URL+"/b.tar.gz", Options{Verification: v})
	if ev := evs.last(); ev.Result != ResultRejected || ev.Reason != ReasonSignature || !strings.Contains(ev.Err.Error(), "bundle missing .signatures.json file") {
		t.Fatalf("unsigned at start: %+v", ev)
	}
	if st := p.Status(); st.Origin != OriginFallback || p.Policy().Revision() != "fallback" || !st.SignatureRequired {
		t.Fatalf("unsigned at start: %s %+v", p.Policy().Revision(), st)
	}
	signed := good("r2").Signed(t, key, "")
	srv.set(func(s *bundleServer) { s.body = signed })
	p.Poll(context.Background())
	if st := p.Status(); p.Policy().Revision() != "r2" || st.Signature != policy.SignatureVerified || st.Origin != OriginBundle {
		t.Fatalf("signed: %s %+v", p.Policy().Revision(), st)
	}
	refused := map[string][]byte{
		"tampered":  bundletest.Tamper(t, good("r3").Signed(t, key, ""), "arbiter/policy.rego", goodPolicy+"\nclassify := {\"class\": \"latency-critical\"}\n"),
		"other key": good("r3").Signed(t, other, ""),
		"unsigned":  good("r3").Build(t),
	}
	for name, body := range refused {
		srv.set(func(s *bundleServer) { s.body = body })
		p.Poll(context.Background())
		if ev := evs.last(); ev.Result != ResultRejected || ev.Reason != ReasonSignature || p.Policy().Revision() != "r2" {
			t.Errorf("%s: event %+v, policy %s", name, ev, p.Policy().Revision())
		}
	}
	if st := p.Status(); st.Failures[ReasonSignature] != 4 || st.Rejections != 4 {
		t.Errorf("status %+v", st)
	}
}

// TestSignedBundleWithoutKey: without a key a signed bundle activates,
// and says its signature was not checked.
func TestSignedBundleWithoutKey(t *testing.T) {
	srv := newBundleServer(t, good("r1").Signed(t, bundletest.ECKey(t), ""))
	p, evs := start(t, srv.URL+"/b.tar.gz", Options{})
	if ev := evs.last(); ev.Result != ResultActivated || ev.Signature != policy.SignatureUnchecked || p.Status().SignatureRequired {
		t.Fatalf("%+v %+v", ev, p.Status())
	}
}

// TestRefusesOversizedBundle: a bundle over MaxBytes is refused, whether
// the server says its length first or streams it; the last good stays.
func TestRefusesOversizedBundle(t *testing.T) {
	small := good("r1").Build(t)
	big := good("r2")
	noise := make([]byte, 20000)
	rand.Read(noise)
	big.Data = map[string]any{"padding": hex.EncodeToString(noise)}
	bigBody := big.Build(t)
	srv := newBundleServer(t, small)
	limit := int64(len(small) + 512)
	if int64(len(bigBody)) <= limit {
		t.Fatalf("test bundle of %d bytes is not over %d", len(bigBody), limit)
	}
	p, evs := start(t, srv.URL+"/b.tar.gz", Options{MaxBytes: limit})
	for _, chunked := range []bool{false, true} {
		srv.set(func(s *bundleServer) { s.body, s.chunked = bigBody, chunked })
		p.Poll(context.Background())
		ev := evs.last()
		if ev.Result != ResultRejected || ev.Reason != ReasonTooLarge || !strings.Contains(ev.Err.Error(), "over the limit") || p.Policy().Revision() != "r1" {
			t.Errorf("chunked %v: %+v, policy %s", chunked, ev, p.Policy().Revision())
		}
	}
}

// TestSlowServerTimesOut: a server slower than the timeout fails the
// fetch with a timeout, counts a failure and backs off; the last good
// policy stays; the next answer resets the count. The timeout is a second,
// so that the fetches that must succeed do on a loaded machine, and the
// slow server would answer only after an hour.
func TestSlowServerTimesOut(t *testing.T) {
	srv := newBundleServer(t, good("r1").Build(t))
	p, evs := start(t, srv.URL+"/b.tar.gz", Options{Timeout: time.Second, MinBackoff: time.Minute, MaxBackoff: 4 * time.Minute})
	srv.set(func(s *bundleServer) { s.delay = time.Hour })
	began := time.Now()
	p.Poll(context.Background())
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("a fetch took %v with a 1 s timeout", took)
	}
	ev := evs.last()
	if ev.Result != ResultFailed || ev.Reason != ReasonTimeout || !strings.Contains(ev.Err.Error(), "no answer within 1s") || ev.Failures != 1 {
		t.Fatalf("event %+v", ev)
	}
	if ev.Next < 30*time.Second || ev.Next > time.Minute {
		t.Errorf("first backoff %v, want within [30s, 1m]", ev.Next)
	}
	p.Poll(context.Background())
	if ev := evs.last(); ev.Failures != 2 || ev.Next < time.Minute || ev.Next > 2*time.Minute {
		t.Errorf("second backoff: %+v", ev)
	}
	st := p.Status()
	if p.Policy().Revision() != "r1" || st.ConsecutiveFailures != 2 || st.LastFetchError == "" || st.Fetches[ResultFailed] != 2 || st.Failures[ReasonTimeout] != 2 {
		t.Fatalf("policy %s, status %+v", p.Policy().Revision(), st)
	}
	srv.set(func(s *bundleServer) { s.delay = 0 })
	p.Poll(context.Background())
	if st := p.Status(); st.ConsecutiveFailures != 0 || st.LastFetchError != "" || st.LastResult != ResultNotModified {
		t.Fatalf("after recovery: %+v", st)
	}
}

// TestDeadServerRetriedWithBackoff: a server that refuses connections at
// start leaves the fallback in force, and one that answers 500 is retried
// in the background with growing waits until it serves the bundle, which
// then activates on its own.
func TestDeadServerRetriedWithBackoff(t *testing.T) {
	p, evs := start(t, deadURL(t), Options{})
	ev := evs.last()
	if ev.Result != ResultFailed || ev.Reason != ReasonConnection || !strings.Contains(ev.Err.Error(), "connection refused") {
		t.Fatalf("dead server: %+v", ev)
	}
	if st := p.Status(); st.Origin != OriginFallback || p.Policy().Revision() != "fallback" || st.ConsecutiveFailures != 1 {
		t.Fatalf("dead server: %+v", st)
	}

	srv := newBundleServer(t, good("r1").Build(t))
	srv.set(func(s *bundleServer) { s.status = http.StatusInternalServerError })
	p, evs = start(t, srv.URL+"/b.tar.gz", Options{MinBackoff: 20 * time.Millisecond, MaxBackoff: 80 * time.Millisecond})
	if ev := evs.last(); ev.Reason != ReasonHTTPStatus || !strings.Contains(ev.Err.Error(), `500 Internal Server Error: "bundle store unavailable"`) {
		t.Fatalf("500: %+v", ev)
	}
	waitFor(t, "four failed fetches in a row", func() bool { return p.Status().ConsecutiveFailures >= 4 })
	srv.set(func(s *bundleServer) { s.status = 0 })
	waitFor(t, "the bundle activated by the background retries", func() bool { return p.Policy().Revision() == "r1" })
	var waits []time.Duration
	for _, ev := range evs.all() {
		if ev.Result == ResultFailed {
			waits = append(waits, ev.Next)
		}
	}
	for i, w := range waits {
		ceiling := min(20*time.Millisecond<<i, 80*time.Millisecond)
		if w < ceiling/2 || w > ceiling {
			t.Errorf("wait after failure %d: %v, want within [%v, %v]", i+1, w, ceiling/2, ceiling)
		}
	}
	if st := p.Status(); st.ConsecutiveFailures != 0 || st.Activations != 1 {
		t.Fatalf("after recovery: %+v", st)
	}
}

// TestBearerToken: the token file is read at every request, so a rotated
// token is used at once; a missing file fails the fetch and says so.
func TestBearerToken(t *testing.T) {
	srv := newBundleServer(t, good("r1").Build(t))
	srv.set(func(s *bundleServer) { s.token = "t0ken-1" })
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("t0ken-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, evs := start(t, srv.URL+"/b.tar.gz", Options{TokenFile: tok})
	if p.Policy().Revision() != "r1" {
		t.Fatalf("with the token: %+v", evs.last())
	}
	srv.set(func(s *bundleServer) { s.token, s.body = "t0ken-2", good("r2").Build(t) })
	os.WriteFile(tok, []byte("t0ken-2"), 0o600)
	p.Poll(context.Background())
	if p.Policy().Revision() != "r2" {
		t.Fatalf("rotated token: %+v", evs.last())
	}
	os.Remove(tok)
	p.Poll(context.Background())
	if ev := evs.last(); ev.Result != ResultFailed || ev.Reason != ReasonToken || !strings.Contains(ev.Err.Error(), "bundle server token") {
		t.Fatalf("no token file: %+v", ev)
	}
}

// TestSavedBundle: the bundle activated is saved, and a later poller whose
// server is down starts on it, checked again; with another key it is
// refused and the fallback is in force.
func TestSavedBundle(t *testing.T) {
	key := bundletest.RSAKey(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "bundle.pub")
	os.WriteFile(keyFile, []byte(key.Public), 0o644)
	v, err := LoadKey(KeyOptions{File: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	save := filepath.Join(dir, "state", "bundle", "saved.tar.gz")
	srv := newBundleServer(t, good("r1").Signed(t, key, ""))
	p, _ := start(t, srv.URL+"/b.tar.gz", Options{Verification: v, SaveFile: save})
	if p.Policy().Revision() != "r1" {
		t.Fatalf("not activated: %+v", p.Status())
	}
	if fi, err := os.Stat(save); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved bundle: %v %v", fi, err)
	}
	p.Close()

	// No retry of the dead server comes between the events counted here.
	p, evs := start(t, deadURL(t), Options{Verification: v, SaveFile: save, MinBackoff: time.Hour, MaxBackoff: time.Hour})
	st := p.Status()
	if p.Policy().Revision() != "r1" || st.Origin != OriginSaved || st.Signature != policy.SignatureVerified || st.Fetches[ResultActivated] != 0 {
		t.Fatalf("restart with the server down: %s %+v", p.Policy().Revision(), st)
	}
	if all := evs.all(); len(all) != 2 || !all[0].Saved || all[0].Result != ResultActivated || all[1].Result != ResultFailed {
		t.Fatalf("events %+v", all)
	}

	otherFile := filepath.Join(dir, "other.pub")
	os.WriteFile(otherFile, []byte(bundletest.RSAKey(t).Public), 0o644)
	v2, err := LoadKey(KeyOptions{File: otherFile})
	if err != nil {
		t.Fatal(err)
	}
	p, evs = start(t, deadURL(t), Options{Verification: v2, SaveFile: save, MinBackoff: time.Hour, MaxBackoff: time.Hour})
	if ev := evs.all()[0]; !ev.Saved || ev.Result != ResultRejected || ev.Reason != ReasonSignature || !strings.Contains(ev.Err.Error(), "saved by an earlier run") {
		t.Fatalf("saved bundle, other key: %+v", ev)
	}
	if p.Status().Origin != OriginFallback {
		t.Fatalf("%+v", p.Status())
	}
}

// TestCloseEndsFetchInFlight: Status answers and Close returns while a
// fetch waits on a slow server, which is not reported as failed.
func TestCloseEndsFetchInFlight(t *testing.T) {
	srv := newBundleServer(t, good("r1").Build(t))
	p, evs := start(t, srv.URL+"/b.tar.gz", Options{Poll: 10 * time.Millisecond})
	srv.set(func(s *bundleServer) { s.delay = 5 * time.Second })
	time.Sleep(100 * time.Millisecond) // the background poll is waiting on the server
	began := time.Now()
	if st := p.Status(); st.Revision != "r1" || time.Since(began) > time.Second {
		t.Fatalf("Status waited %v for the fetch in flight", time.Since(began))
	}
	p.Close()
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("Close took %v", took)
	}
	for _, ev := range evs.all() {
		if ev.Result == ResultFailed {
			t.Errorf("a stopped fetch reported as failed: %+v", ev)
		}
	}
	if p.Policy().Revision() != "r1" {
		t.Error("policy lost on Close")
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	fb := fallback(t)
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{URL: "ftp://host/b.tar.gz", Fallback: fb}, "want an http:// or https:// URL"},
		{Options{URL: "https:///b.tar.gz", Fallback: fb}, "no host"},
		{Options{URL: "https://host/b.tar.gz"}, "no fallback policy"},
	} {
		_, err := New(context.Background(), c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.opts.URL, err, c.want)
		}
	}
	// A URL's password never reaches the status.
	p, _ := start(t, "http://user:s3cret@"+strings.TrimPrefix(deadURL(t), "http://"), Options{})
	if st := p.Status(); strings.Contains(st.URL, "s3cret") || !strings.Contains(st.URL, "user:xxxxx@") {
		t.Errorf("status URL %q", st.URL)
	}
}

func TestBackoff(t *testing.T) {
	for n := 1; n <= 12; n++ {
		ceiling := min(time.Second<<(n-1), time.Minute)
		for range 50 {
			if d := backoff(n, time.Second, time.Minute); d < ceiling/2 || d > ceiling {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v]", n, d, ceiling/2, ceiling)
			}
		}
	}
	seen := map[time.Duration]bool{}
	for range 50 {
		d := pollDelay(time.Minute)
		if d < time.Minute || d > 90*time.Second {
			t.Fatalf("pollDelay = %v", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Errorf("poll delays barely vary: %v", seen)
	}
}
