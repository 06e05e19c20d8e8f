package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/compile"
	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/internal/bundletest"
	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/fetch"
	"github.com/gpu-arbiter/arbiter/web"
)

// bundleTest is a test of this package's own: a test that fails, at row 7
// of its file.
const bundleTest = `package arbiter_test

import data.arbiter

test_bystander if arbiter.classify.class == "bystander" with input.process.env as {}

test_everything_latency_critical if {
	arbiter.classify.class == "latency-critical" with input.process.env as {}
}
`

// fleetBundle is the daemon tests' policy as a bundle at revision rev.
func fleetBundle(rev string) bundletest.Bundle {
	return bundletest.Bundle{Revision: rev, Modules: map[string]string{"arbiter/policy.rego": testPolicy}}
}

// bundleHTTP is a real HTTP server serving one bundle with an ETag, as a
// bundle server does; what it serves can be changed while it runs.
type bundleHTTP struct {
	*httptest.Server
	mu   sync.Mutex
	body []byte
}

func newBundleHTTP(t *testing.T, body []byte) *bundleHTTP {
	t.Helper()
	b := &bundleHTTP{body: body}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		body := b.body
		b.mu.Unlock()
		etag := fmt.Sprintf(`"%x"`, sha256.Sum256(body))
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Write(body)
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *bundleHTTP) serve(body []byte) {
	b.mu.Lock()
	b.body = body
	b.mu.Unlock()
}

// logLine returns the JSON log line with message msg, failing the test
// when there is none.
func logLine(t *testing.T, log *bytes.Buffer, msg string) map[string]any {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(log.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["message"] == msg {
			return m
		}
	}
	t.Fatalf("no log line %q in:\n%s", msg, log)
	return nil
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBundlePolicyLogsAndStatus: the daemon's bundle policy against a
// real HTTP server. With no good bundle at start it observes only and
// says so; each fetch after that is one clear log line naming the URL,
// the revision and ETag, and for a refused bundle why, at file:row; the
// API's status and history follow, changes through the API are refused,
// and a restart with the server gone starts on the saved bundle.
func TestBundlePolicyLogsAndStatus(t *testing.T) {
	key := bundletest.RSAKey(t)
	srv := newBundleHTTP(t, fleetBundle("r1").Build(t)) // unsigned: refused
	cfg := config.Default()
	cfg.StateDir, cfg.BundleURL, cfg.BundlePublicKey = t.TempDir(), srv.URL+"/fleet/arbiter.tar.gz", writeFile(t, "bundle.pem", key.Public)
	var log bytes.Buffer
	lp, err := openBundlePolicy(context.Background(), cfg, zerolog.New(&log))
	if err != nil {
		t.Fatal(err)
	}
	defer lp.close()
	var swaps []string
	lp.onReload(func(why string) { swaps = append(swaps, why) })
	svc := newPolicyService(lp, nil, nil, nil)

	l := logLine(t, &log, "policy bundle rejected: the last good policy stays in force")
	if l["level"] != "error" || l["bundle_url"] != cfg.BundleURL || l["revision"] != nil || l["reason"] != "signature" ||
		!strings.Contains(fmt.Sprint(l["error"]), "bundle missing .signatures.json file") || l["in_force"] != observeOnlyRevision {
		t.Errorf("unsigned bundle: %v", l)
	}
	logLine(t, &log, "no good policy bundle yet: every process is observed and none preempted until one passes its checks")
	st := svc.Status()
	if st.Revision != observeOnlyRevision || st.Bundle == nil || st.Bundle.Origin != "fallback" || !strings.Contains(st.LastError, ".signatures.json") ||
		!strings.Contains(st.ReadOnly, "bundle server") {
		t.Fatalf("status at start: %+v %+v", st, st.Bundle)
	}
	if d := lp.current().Default(); d.Class != "unclassified" || d.Preemption.Mode != "observe" {
		t.Fatalf("fallback decision %+v", d)
	}

	srv.serve(fleetBundle("r1").Signed(t, key, ""))
	log.Reset()
	lp.reload(context.Background())
	l = logLine(t, &log, "policy bundle activated: reclassifying every process")
	if l["revision"] != "r1" || l["etag"] == nil || l["signature"] != "verified" || lp.current().Revision() != "r1" {
		t.Errorf("activated: %v", l)
	}
	if len(swaps) != 1 || swaps[0] != "policy bundle revision r1" {
		t.Errorf("reclassifications %q", swaps)
	}

	bad := fleetBundle("r2")
	bad.Modules["arbiter/policy_test.rego"] = bundleTest
	srv.serve(bad.Signed(t, key, ""))
	log.Reset()
	lp.reload(context.Background())
	l = logLine(t, &log, "policy bundle rejected: the last good policy stays in force")
	if l["revision"] != "r2" || l["etag"] == nil || l["reason"] != "tests" || l["in_force"] != "r1" ||
		!strings.Contains(fmt.Sprint(l["error"]), "arbiter/policy_test.rego:7: arbiter_test_failure: test arbiter_test.test_everything_latency_critical: fail") {
		t.Errorf("failing tests: %v", l)
	}
	st = svc.Status()
	if st.Revision != "r1" || st.Rejected != 2 || st.Reloads != 1 || len(st.Diagnostics) != 1 || st.Diagnostics[0].Row != 7 ||
		st.Bundle.LastErrorReason != "tests" || st.Bundle.LastErrorRevision != "r2" || st.Bundle.Fetches["rejected"] != 2 || st.Bundle.Failures["signature"] != 1 {
		t.Errorf("status after a refused bundle: %+v %+v", st, st.Bundle)
	}
	if h := svc.History(); len(h) != 2 || h[0].Origin != "bundle" || h[0].Revision != "r1" || !h[0].Current {
		t.Errorf("history %+v", h)
	}
	if _, err := svc.Apply(context.Background(), web.PolicyFiles{"p.rego": []byte(testPolicy)}); !errors.Is(err, web.ErrPolicyReadOnly) ||
		!strings.Contains(err.Error(), "publish a new bundle there") {
		t.Errorf("apply: %v", err)
	}
	if _, err := svc.Rollback(context.Background(), "r1"); !errors.Is(err, web.ErrPolicyReadOnly) {
		t.Errorf("rollback: %v", err)
	}
	var out bytes.Buffer
	writeBundle(&out, st.Bundle)
	if !strings.Contains(out.String(), "fetched, signature verified; last fetch") {
		t.Errorf("arbiter status: %s", &out)
	}

	srv.Close()
	log.Reset()
	lp.reload(context.Background())
	l = logLine(t, &log, "policy bundle fetch failed: the last good policy stays in force; retrying")
	if l["level"] != "warn" || l["reason"] != "connection" || l["failures"] != 1.0 || l["retry_in"] == nil || lp.current().Revision() != "r1" {
		t.Errorf("dead server: %v", l)
	}
	lp.close()

	log.Reset()
	lp2, err := openBundlePolicy(context.Background(), cfg, zerolog.New(&log))
	if err != nil {
		t.Fatal(err)
	}
	defer lp2.close()
	l = logLine(t, &log, "starting on the policy bundle saved by the last run, checked again, until the bundle server answers")
	if l["revision"] != "r1" || lp2.current().Revision() != "r1" {
		t.Errorf("restart on the saved bundle: %v", l)
	}
}

// TestOPABuildBundle follows docs/install.md: the default policy with
// `arbiter policy lib` beside it, built and signed by OPA's own bundle
// compiler (what `opa build --signing-key` runs), verifies and passes the
// daemon's checks; without the library, OPA's compiler refuses it.
func TestOPABuildBundle(t *testing.T) {
	lib, _, err := runCmd(t, "policy", "lib")
	if err != nil || !strings.HasPrefix(lib, "# METADATA") || !strings.Contains(lib, "package arbiter.lib") || strings.Contains(lib, "package arbiter.lib_test") {
		t.Fatalf("arbiter policy lib: %v\n%s", err, lib)
	}
	dir := filepath.Join(t.TempDir(), "policy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"policy.rego", "policy_test.rego"} {
		b, err := os.ReadFile(filepath.Join("../../rego/default", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	key := bundletest.RSAKey(t)
	priv := writeFile(t, "key.pem", key.Private)
	build := func() ([]byte, error) {
		var out bytes.Buffer
		err := compile.New().WithPaths(dir).WithAsBundle(true).WithRevision("2026-03-01.1").WithOutput(&out).
			WithBundleSigningConfig(bundle.NewSigningConfig(priv, "RS256", "")).WithBundleVerificationKeyID("default").Build(context.Background())
		return out.Bytes(), err
	}
	if _, err := build(); err == nil || !strings.Contains(err.Error(), "undefined function data.arbiter.lib") {
		t.Fatalf("opa build without the library: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "arbiter_lib.rego"), []byte(lib), 0o644)
	data, err := build()
	if err != nil {
		t.Fatal(err)
	}
	v, err := fetch.LoadKey(fetch.KeyOptions{File: writeFile(t, "key.pub", key.Public)})
	if err != nil {
		t.Fatal(err)
	}
	src, err := policy.ReadBundle("bundle.tar.gz", data, &policy.BundleOptions{Verification: v}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Check(context.Background(), src, nil); err != nil || src.Revision != "2026-03-01.1" || src.Library != policy.LibraryOwn || src.Signature != policy.SignatureVerified {
		t.Fatalf("check: %v; revision %s library %s signature %s", err, src.Revision, src.Library, src.Signature)
	}
}

// TestBundleSettingsRefused: --policy with --bundle-url, and a key that
// cannot verify anything, stop the daemon before it starts, saying why.
func TestBundleSettingsRefused(t *testing.T) {
	conf := writeFile(t, "config.yaml", "log_format: json\n")
	code, out := runMain(t, "run", "--config", conf, "--policy", t.TempDir(), "--bundle-url", "https://bundles.example.com/a.tar.gz")
	if code == 0 || !strings.Contains(out, "and bundle_url (https://bundles.example.com/a.tar.gz) are both set") {
		t.Errorf("--policy and --bundle-url: exit %d\n%s", code, out)
	}
	code, out = runMain(t, "run", "--config", conf, "--bundle-public-key", writeFile(t, "k.pem", "x"))
	if code == 0 || !strings.Contains(out, "bundle_public_key is set but bundle_url is not") {
		t.Errorf("key without URL: exit %d\n%s", code, out)
	}
	lp, err := openBundlePolicy(context.Background(), func() config.Config {
		c := config.Default()
		c.StateDir, c.BundleURL, c.BundlePublicKey = t.TempDir(), "http://127.0.0.1:1/b.tar.gz", writeFile(t, "k.pem", bundletest.RSAKey(t).Private)
		return c
	}(), zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "--bundle-public-key: bundle verification key") || !strings.Contains(err.Error(), "public key only") {
		t.Errorf("a private key: %v", err)
		if lp != nil {
			lp.close()
		}
	}
}

// TestDaemonBundle: `arbiter run --bundle-url` against a real HTTP server
// serving signed bundles: the bundle's revision is in the API and
// /metrics, its policy classifies the workloads, a tampered bundle is
// refused with a log line and the policy in force kept, and a new signed
// revision is picked up by polling.
func TestDaemonBundle(t *testing.T) {
	node := newRecoverNode(t)
	b := cudastub.ForTest(t)
	key := bundletest.RSAKey(t)
	srv := newBundleHTTP(t, fleetBundle("fleet-r1").Signed(t, key, ""))
	d := startDaemon(t, node, "", "--bundle-url", srv.URL+"/arbiter.tar.gz", "--bundle-public-key", writeFile(t, "bundle.pem", key.Public),
		"--bundle-poll", "1s")
	st := d.status()
	if st.Policy.Revision != "fleet-r1" || st.Policy.Bundle == nil || st.Policy.Bundle.Origin != "bundle" || st.Policy.Bundle.Signature != "verified" {
		t.Fatalf("policy at start: %+v %+v\n%s", st.Policy, st.Policy.Bundle, d.output())
	}
	train := startWorkload(t, "best-effort", b.Train, "--kernel-us", "200", "--sync-every", "4", "--duration", "3")
	d.waitProcess(train.Process.Pid, "best-effort", "")

	srv.serve(bundletest.Tamper(t, fleetBundle("fleet-r2").Signed(t, key, ""), "arbiter/policy.rego", observeOnlyPolicy))
	d.waitStatus("the tampered bundle refused", func(st web.StatusView) bool { return st.Policy.Bundle.LastErrorReason == "signature" })
	if st := d.status(); st.Policy.Revision != "fleet-r1" || !strings.Contains(st.Policy.LastError, "digest mismatch") {
		t.Errorf("after the tampered bundle: %+v", st.Policy)
	}
	if out := d.output(); !strings.Contains(out, `"message":"policy bundle rejected: the last good policy stays in force"`) || !strings.Contains(out, `"reason":"signature"`) {
		t.Errorf("no rejection in the log:\n%s", out)
	}

	srv.serve(fleetBundle("fleet-r3").Signed(t, key, ""))
	d.waitStatus("revision fleet-r3", func(st web.StatusView) bool { return st.Policy.Revision == "fleet-r3" })
	metrics := d.metrics()
	for _, want := range []string{`arbiter_policy_info{revision="fleet-r3"} 1`, `arbiter_policy_bundle_fetches_total{result="activated"} 2`,
		`arbiter_policy_bundle_failures_total{reason="signature"} 1`, `arbiter_policy_bundle_info{origin="bundle",signature="verified"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if err := train.Wait(); err != nil {
		t.Errorf("workload: %v", err)
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("stop: %v\n%s", err, d.output())
	}
}

func (d *testDaemon) status() web.StatusView {
	d.t.Helper()
	var st web.StatusView
	if err := newDaemonClient(d.socket()).get(context.Background(), "status", &st); err != nil {
		d.t.Fatal(err)
	}
	if st.Policy == nil {
		d.t.Fatalf("no policy in the status:\n%s", d.output())
	}
	return st
}

// waitStatus waits up to 15 s for the daemon's status to satisfy ok.
func (d *testDaemon) waitStatus(what string, ok func(web.StatusView) bool) {
	d.t.Helper()
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if st := d.status(); st.Policy.Bundle != nil && ok(st) {
			return
		}
	}
	d.t.Fatalf("timed out waiting for %s: %+v\n%s", what, d.status().Policy, d.output())
}

// metrics scrapes /metrics on the daemon's socket.
func (d *testDaemon) metrics() string {
	d.t.Helper()
	resp, err := newDaemonClient(d.socket()).http.Get("http://arbiter/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
