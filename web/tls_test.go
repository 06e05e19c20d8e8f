package web

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/internal/testcert"
)

// logBuffer is a zerolog sink safe for the server's goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServeTCPTLS serves the API over HTTPS with a certificate made for
// the test: requests and the event stream work over it (HTTP/2, with
// HSTS); plain HTTP to the port is answered with a clear 400; a renewed
// certificate is served at the next connection without a restart; a
// renewal that does not load leaves the old one serving and is logged
// once.
func TestServeTCPTLS(t *testing.T) {
	f := newFixture(t, 5, Limits{Heartbeat: 100 * time.Millisecond})
	var logs logBuffer
	ca := testcert.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t, dir, 100)
	kp, err := LoadKeyPair(certFile, keyFile, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	addr := freeLoopback(t)
	errc := make(chan error, 1)
	go func() { errc <- f.s.ServeTCP(addr, &TCPOptions{TLS: kp}) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = f.s.Shutdown(ctx)
		if err := <-errc; err != nil {
			t.Errorf("ServeTCP: %v", err)
		}
	})
	// A new connection for each request: each sees the certificate in
	// use at that moment.
	client := func() *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true, DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	}
	serial := func() int64 {
		t.Helper()
		var resp *http.Response
		var err error
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) { // the listener may not be up yet
			if resp, err = client().Get("https://" + addr + "/api/v1/status"); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("GET over HTTPS: %v", err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"hostname":"node1"`) {
			t.Fatalf("GET /status over HTTPS: %d %.200s", resp.StatusCode, body)
		}
		if resp.Proto != "HTTP/2.0" || !strings.HasPrefix(resp.Header.Get("Strict-Transport-Security"), "max-age=") {
			t.Errorf("%s, HSTS %q; want HTTP/2.0 with HSTS", resp.Proto, resp.Header.Get("Strict-Transport-Security"))
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	if s := serial(); s != 100 {
		t.Errorf("serving certificate %d, want 100", s)
	}

	// The event stream over HTTPS.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+addr+"/api/v1/events?form=delta", nil)
	resp, err := client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	ch := readEvents(bufio.NewReader(resp.Body))
	next(t, ch, "snapshot")
	next(t, ch, "")
	cancel()
	resp.Body.Close()

	// Plain HTTP to the HTTPS port.
	presp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/api/v1/status")
	if err != nil {
		t.Fatalf("plain HTTP to the TLS port: %v", err)
	}
	pbody, _ := io.ReadAll(presp.Body)
	presp.Body.Close()
	if presp.StatusCode != http.StatusBadRequest || !strings.Contains(string(pbody), "Client sent an HTTP request to an HTTPS server") {
		t.Errorf("plain HTTP to the TLS port: %d %q", presp.StatusCode, pbody)
	}

	// Renewal: new files in place.
	ca.Issue(t, dir, 200)
	if s := serial(); s != 200 {
		t.Errorf("after renewal serving certificate %d, want 200", s)
	}
	if !strings.Contains(logs.String(), "TLS certificate read again after a change") {
		t.Errorf("renewal not logged:\n%s", logs.String())
	}
	// A renewal that does not load: a key of another certificate.
	other := t.TempDir()
	_, otherKey := ca.Issue(t, other, 300)
	b, err := os.ReadFile(otherKey)
	if err != nil {
		t.Fatal(err)
	}
	testcert.Replace(t, keyFile, b)
	for range 3 {
		if s := serial(); s != 200 {
			t.Errorf("after a bad renewal serving certificate %d, want 200 still", s)
		}
	}
	if n := strings.Count(logs.String(), "does not load"); n != 1 || !strings.Contains(logs.String(), "private key does not match public key") {
		t.Errorf("a bad renewal logged %d times, want once with the cause:\n%s", n, logs.String())
	}
}

// freeLoopback returns a loopback address no one listens on now.
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestLoadKeyPairErrors: each wrong file is named, with what it should
// hold.
func TestLoadKeyPairErrors(t *testing.T) {
	ca := testcert.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t, dir, 1)
	_, otherKey := ca.Issue(t, t.TempDir(), 2)
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		name, cert, key string
		want            []string
	}{
		{"no certificate file", missing, keyFile, []string{"TLS certificate " + missing, "no such file"}},
		{"no key file", certFile, missing, []string{"TLS key " + missing, "no such file"}},
		{"the key as certificate", keyFile, keyFile, []string{"TLS certificate " + keyFile + " holds no PEM certificate"}},
		{"the certificate as key", certFile, certFile, []string{"TLS key " + certFile + " holds no PEM private key"}},
		{"a key of another certificate", certFile, otherKey, []string{"TLS certificate " + certFile + " and key " + otherKey, "private key does not match public key"}},
		{"a directory", dir, keyFile, []string{"TLS certificate " + dir, "is a directory"}},
	} {
		_, err := LoadKeyPair(c.cert, c.key, zerolog.Nop())
		if err == nil {
			t.Errorf("%s: loaded", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v\nwant it to say %q", c.name, err, w)
			}
		}
	}
	if _, err := LoadKeyPair(certFile, keyFile, zerolog.Nop()); err != nil {
		t.Errorf("a good pair: %v", err)
	}
}

// TestServeTCPRefusesTLSAndPlain: the two cannot be asked for together.
func TestServeTCPRefusesTLSAndPlain(t *testing.T) {
	f := newFixture(t, 1, Limits{})
	ca := testcert.NewCA(t)
	certFile, keyFile := ca.Issue(t, t.TempDir(), 1)
	kp, err := LoadKeyPair(certFile, keyFile, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	err = f.s.ServeTCP("127.0.0.1:0", &TCPOptions{TLS: kp, Plain: true})
	if err == nil || !strings.Contains(err.Error(), "choose one") || errors.Is(err, ErrPlainOffLoopback) {
		t.Errorf("TLS and plain: %v", err)
	}
}
