package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/testcert"
	"github.com/gpu-arbiter/arbiter/web"
)

// TestDaemonServesTLS: with --tls-cert and --tls-key the daemon serves
// the API and the console on --listen over HTTPS, answers plain HTTP
// there with a clear 400, and keeps its unix socket plain for ps and
// status.
func TestDaemonServesTLS(t *testing.T) {
	node := newRecoverNode(t)
	ca := testcert.NewCA(t)
	cert, key := ca.Issue(t, t.TempDir(), 7)
	d := startDaemon(t, node, policyDir(t, map[string]string{"p.rego": testPolicy}), "--tls-cert", cert, "--tls-key", key)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}

	resp, err := client.Get("https://" + d.addr + "/api/v1/status")
	if err != nil {
		t.Fatalf("GET over HTTPS: %v\n%s", err, d.output())
	}
	var st web.StatusView
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !st.Ready || resp.TLS.PeerCertificates[0].SerialNumber.Int64() != 7 {
		t.Errorf("GET /status over HTTPS: %d, ready %v, %v", resp.StatusCode, st.Ready, err)
	}
	resp, err = client.Get("https://" + d.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Errorf("the console over HTTPS: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}

	resp, err = (&http.Client{Timeout: 10 * time.Second}).Get("http://" + d.addr + "/api/v1/status")
	if err != nil {
		t.Fatalf("plain HTTP to the TLS port: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Client sent an HTTP request to an HTTPS server") {
		t.Errorf("plain HTTP to the TLS port: %d %q", resp.StatusCode, body)
	}
	if code, out := runMain(t, "status", "--socket", d.socket()); code != 0 {
		t.Errorf("status over the plain unix socket: exit %d\n%s", code, out)
	}
	if !strings.Contains(d.output(), `"tls":true`) {
		t.Errorf("the log does not say the API listens with TLS:\n%s", d.output())
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("clean stop: %v\n%s", err, d.output())
	}
}

// TestRunTLSRefused: a TLS file that is missing or wrong, a certificate
// without its key, TLS together with --listen-plain, and plain HTTP off
// loopback, and an address in use, each keep the daemon from starting,
// with an error that names the file or the flags and the fix, before it
// pins or writes anything.
func TestRunTLSRefused(t *testing.T) {
	node := newRecoverNode(t)
	pol := policyDir(t, map[string]string{"p.rego": testPolicy})
	ca := testcert.NewCA(t)
	cert, key := ca.Issue(t, t.TempDir(), 1)
	_, otherKey := ca.Issue(t, t.TempDir(), 2)
	missing := filepath.Join(t.TempDir(), "tls.crt")
	empty := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"address in use", []string{"--listen", busy.Addr().String()},
			[]string{"serve the API on " + busy.Addr().String() + " (--listen)", "address already in use"}},
		{"missing certificate", []string{"--tls-cert", missing, "--tls-key", key},
			[]string{"--tls-cert", "TLS certificate " + missing, "no such file or directory"}},
		{"missing key", []string{"--tls-cert", cert, "--tls-key", missing},
			[]string{"TLS key " + missing, "no such file or directory"}},
		{"empty certificate", []string{"--tls-cert", empty, "--tls-key", key},
			[]string{"TLS certificate " + empty + " holds no PEM certificate"}},
		{"key of another certificate", []string{"--tls-cert", cert, "--tls-key", otherKey},
			[]string{"TLS certificate " + cert + " and key " + otherKey, "private key does not match public key"}},
		{"certificate without key", []string{"--tls-cert", cert},
			[]string{"tls_cert (" + cert + ") is set but tls_key is not"}},
		{"TLS and plain", []string{"--tls-cert", cert, "--tls-key", key, "--listen-plain"},
			[]string{"listen_plain and tls_cert/tls_key are both set"}},
		{"plain off loopback", []string{"--listen", "0.0.0.0" + freeAddr(t)[len("127.0.0.1"):]},
			[]string{"(--listen)", "plain HTTP off loopback would send the API token in clear", "--tls-cert and --tls-key; or --listen-plain"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"run", "--policy", pol, "--state-dir", filepath.Dir(node.stateDir), "--socket", filepath.Join(t.TempDir(), "s"),
				"--bpffs", node.pinDir, "--listen", freeAddr(t), "--log-format", "json"}, c.args...)
			code, out := runMain(t, args...)
			if code == 0 {
				t.Fatalf("the daemon started:\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("exit %d; the output does not say %q:\n%s", code, w, out)
				}
			}
			// Refused before it touched the node: nothing pinned, no
			// state written.
			for _, p := range []string{filepath.Join(node.pinDir, "nvrm"), node.stateDir} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left by a daemon that refused to start (%v)", p, err)
				}
			}
		})
	}
}
