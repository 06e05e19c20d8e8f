package web

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/rego"
)

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// fmtPtr prints what v points to, or nil.
func fmtPtr(v *float64) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprint(*v)
}

// TestReadEndpoints: every GET endpoint answers from the real engine's
// snapshot, with the fields the console needs.
func TestReadEndpoints(t *testing.T) {
	f := newFixture(t, 40, Limits{})
	f.eng.waitFor(t, func(s *engineSnapshot) bool { return s.Stats.Requests >= 12 })

	w := f.do("GET", "/api/v1/status", nil)
	if w.Code != 200 {
		t.Fatalf("status: %d %s", w.Code, w.Body)
	}
	st := decode[StatusView](t, w.Body.Bytes())
	if st.Node.Hostname != "node1" || st.Version != "test" || st.Ready || st.Counts.Processes != 40 ||
		st.Counts.Classes["latency-critical"]["running"] != 4 || st.Counts.Unmanaged != 2 || st.Policy == nil ||
		st.Policy.Revision == "" || st.Engine.Events == 0 {
		t.Errorf("status: %+v", st)
	}

	w = f.do("GET", "/api/v1/processes", nil)
	list := decode[ProcessList](t, w.Body.Bytes())
	if w.Code != 200 || len(list.Processes) != 40 {
		t.Fatalf("processes: %d, %d of them", w.Code, len(list.Processes))
	}
	var lc, obs, be int
	for _, p := range list.Processes {
		switch p.Class {
		case "latency-critical":
			lc++
			if p.Requests < 3 || p.Attainment == nil || *p.Attainment != 1 || p.P99Seconds <= 0 {
				t.Errorf("LC process %d: requests %d attainment %s p99 %v", p.PID, p.Requests, fmtPtr(p.Attainment), p.P99Seconds)
			}
		case "observed":
			obs++
			if !p.Unmanaged || !strings.Contains(p.UnmanagedReason, "observe") {
				t.Errorf("observed process %d: unmanaged %v %q", p.PID, p.Unmanaged, p.UnmanagedReason)
			}
		case "best-effort":
			be++
			if p.Unmanaged || p.Level.String() != "suspend" || p.State != "running" {
				t.Errorf("BE process %+v", p)
			}
		}
	}
	if lc != 4 || obs != 2 || be != 34 {
		t.Errorf("classes: lc %d observed %d be %d", lc, obs, be)
	}
	w = f.do("GET", "/api/v1/processes?class=latency-critical&state=running", nil)
	if l := decode[ProcessList](t, w.Body.Bytes()); len(l.Processes) != 4 {
		t.Errorf("filtered: %d", len(l.Processes))
	}
	w = f.do("GET", "/api/v1/processes/1000", nil)
	if p := decode[ProcessItem](t, w.Body.Bytes()); w.Code != 200 || p.PID != 1000 || p.Comm != "infer" || !p.LatencyCritical {
		t.Errorf("process 1000: %d %+v", w.Code, p)
	}
	w = f.do("GET", "/api/v1/classes", nil)
	cls := decode[struct{ Classes []ClassItem }](t, w.Body.Bytes())
	if len(cls.Classes) != 3 {
		t.Errorf("classes: %s", w.Body)
	}
	for _, c := range cls.Classes {
		if c.Name == "latency-critical" && (c.Attainment == nil || c.Latency.Requests < 12 || c.States["running"] != 4) {
			t.Errorf("LC class %+v (attainment %s)", c, fmtPtr(c.Attainment))
		}
	}
	w = f.do("GET", "/api/v1/gpus", nil)
	g := decode[struct{ GPUs []GPUItem }](t, w.Body.Bytes())
	if len(g.GPUs) != 2 || g.GPUs[0].UUID != "GPU-aaaa" || g.GPUs[0].Processes+g.GPUs[1].Processes != 40 {
		t.Errorf("gpus: %s", w.Body)
	}
	w = f.do("GET", "/api/v1/decisions", nil)
	d := decode[DecisionList](t, w.Body.Bytes())
	if len(d.Decisions) == 0 || d.Total < uint64(len(d.Decisions)) || d.Time == 0 {
		t.Errorf("decisions: %s", w.Body)
	}
	w = f.do("GET", "/api/v1/decisions?since="+itoa(d.Time), nil)
	if later := decode[DecisionList](t, w.Body.Bytes()); len(later.Decisions) >= len(d.Decisions) {
		t.Errorf("since %d: %d decisions, not fewer than %d", d.Time, len(later.Decisions), len(d.Decisions))
	}
	w = f.do("GET", "/api/v1/decisions?limit=3", nil)
	if l := decode[DecisionList](t, w.Body.Bytes()); len(l.Decisions) != 3 {
		t.Errorf("limit 3: %d", len(l.Decisions))
	}
	w = f.do("GET", "/api/v1/preemptions", nil)
	if p := decode[DecisionList](t, w.Body.Bytes()); w.Code != 200 || p.Total == 0 {
		t.Errorf("preemptions: %s", w.Body)
	}
	if w = f.do("GET", "/api/v1/openapi.yaml", nil); w.Code != 200 || !strings.HasPrefix(w.Body.String(), "openapi: 3") {
		t.Errorf("openapi: %d", w.Code)
	}
}

// TestLaunchRate: launches between two snapshots over the time between
// them.
func TestLaunchRate(t *testing.T) {
	// No broadcast tick moves the rate's baseline: only this test's requests do.
	f := newFixture(t, 20, Limits{SnapshotInterval: time.Hour})
	f.do("GET", "/api/v1/processes", nil) // remember this snapshot
	first := f.eng.Snapshot()
	for range 50 {
		f.eng.src.push(launchEv(1001))
	}
	f.eng.waitFor(t, func(s *engineSnapshot) bool { return s != first && proc(s, 1001).Launches >= 51 })
	w := f.do("GET", "/api/v1/processes/1001", nil)
	p := decode[ProcessItem](t, w.Body.Bytes())
	if p.LaunchRate <= 0 {
		t.Errorf("launch rate %v after 50 launches", p.LaunchRate)
	}
	if q := decode[ProcessItem](t, f.do("GET", "/api/v1/processes/1002", nil).Body.Bytes()); q.LaunchRate != 0 {
		t.Errorf("idle process: launch rate %v", q.LaunchRate)
	}
}

// TestBadRequests: every kind of bad input gets a 4xx and a message that
// says what was wrong.
func TestBadRequests(t *testing.T) {
	f := newFixture(t, 10, Limits{MaxBodyBytes: 4096, MutationsPerSecond: 1000, MutationBurst: 1000})
	big := `{"files": {"a.rego": "` + strings.Repeat("x", 5000) + `"}}`
	cases := []struct {
		name, method, path, body string
		hdr                      []string
		code                     int
		msg                      string
	}{
		{"no such route", "GET", "/api/v1/nope", "", nil, 404, "no such endpoint"},
		{"wrong method", "DELETE", "/api/v1/status", "", nil, 405, "not allowed"},
		{"bad pid", "GET", "/api/v1/processes/abc", "", nil, 400, "positive integer"},
		{"unknown pid", "GET", "/api/v1/processes/99999", "", nil, 404, "99999"},
		{"bad state", "GET", "/api/v1/processes?state=sleeping", "", nil, 400, "running, suspended or gated"},
		{"unknown param", "GET", "/api/v1/processes?klass=x", "", nil, 400, "klass"},
		{"repeated param", "GET", "/api/v1/processes?class=a&class=b", "", nil, 400, "2 times"},
		{"empty filter", "GET", "/api/v1/processes?class=", "", nil, 400, "class: empty"},
		{"param on the policy", "GET", "/api/v1/policy?x=1", "", nil, 400, "takes none"},
		{"param on its history", "GET", "/api/v1/policy/history?x=1", "", nil, 400, "takes none"},
		{"param on a policy change", "POST", "/api/v1/policy/validate?force=1", `{"files":{}}`, nil, 400, "takes none"},
		{"bad since", "GET", "/api/v1/decisions?since=-1", "", nil, 400, "engine time"},
		{"bad limit", "GET", "/api/v1/preemptions?limit=0", "", nil, 400, "1 to"},
		{"no token", "POST", "/api/v1/policy/validate", `{"files":{}}`, []string{"Authorization", ""}, 401, "Bearer"},
		{"wrong token", "POST", "/api/v1/policy/apply", `{"files":{}}`, []string{"Authorization", "Bearer " + strings.Repeat("0", 64)}, 401, "token"},
		{"basic auth", "POST", "/api/v1/policy/apply", `{"files":{}}`, []string{"Authorization", "Basic YTpi"}, 401, "token"},
		{"form body", "POST", "/api/v1/policy/apply", `files=x`, []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "application/json"},
		{"text body", "POST", "/api/v1/policy/apply", `{}`, []string{"Content-Type", "text/plain"}, 415, "application/json"},
		{"malformed JSON", "POST", "/api/v1/policy/validate", `{"files": {`, nil, 400, "malformed JSON"},
		{"syntax error", "POST", "/api/v1/policy/validate", `{"files": x}`, nil, 400, "byte"},
		{"wrong type", "POST", "/api/v1/policy/validate", `{"files": ["a"]}`, nil, 400, `field "files"`},
		{"unknown field", "POST", "/api/v1/policy/validate", `{"files": {"a.rego": "package x"}, "force": true}`, nil, 400, `unknown field "force"`},
		{"trailing data", "POST", "/api/v1/policy/validate", `{"files": {"a.rego": "package x"}} {}`, nil, 400, "after the first JSON value"},
		{"empty body", "POST", "/api/v1/policy/dry-run", ``, nil, 400, "empty request body"},
		{"oversized body", "POST", "/api/v1/policy/apply", big, nil, 413, "limit of 4096 bytes"},
		{"no files", "POST", "/api/v1/policy/apply", `{"files": {}}`, nil, 400, "no policy files"},
		{"path escape", "POST", "/api/v1/policy/apply", `{"files": {"../etc/x.rego": "package x"}}`, nil, 400, `".."`},
		{"hidden file", "POST", "/api/v1/policy/apply", `{"files": {".x.rego": "package x"}}`, nil, 400, "hidden"},
		{"absolute path", "POST", "/api/v1/policy/apply", `{"files": {"/x.rego": "package x"}}`, nil, 400, "relative path"},
		{"not a policy file", "POST", "/api/v1/policy/apply", `{"files": {"run.sh": "rm -rf /"}}`, nil, 400, "only *.rego"},
		{"no revision", "POST", "/api/v1/policy/rollback", `{"revision": ""}`, nil, 400, "revision"},
		{"unknown revision", "POST", "/api/v1/policy/rollback", `{"revision": "nope"}`, nil, 404, "unknown policy revision"},
		{"rollback unknown field", "POST", "/api/v1/policy/rollback", `{"rev": "x"}`, nil, 400, `unknown field "rev"`},
		{"GET on a POST route", "GET", "/api/v1/policy/apply", "", nil, 405, "not allowed"},
		{"POST on a GET route", "POST", "/api/v1/status", "{}", nil, 405, "not allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body any
			if c.body != "" {
				body = c.body
			}
			w := f.do(c.method, c.path, body, c.hdr...)
			if w.Code != c.code {
				t.Fatalf("%s %s: %d, want %d: %s", c.method, c.path, w.Code, c.code, w.Body)
			}
			e := decode[apiError](t, w.Body.Bytes())
			if !strings.Contains(e.Error, c.msg) {
				t.Errorf("error %q does not say %q", e.Error, c.msg)
			}
			if w.Header().Get("Content-Security-Policy") == "" {
				t.Error("no Content-Security-Policy on an error response")
			}
		})
	}
}

// TestPolicyEndpoints: validate, dry-run, apply, history and rollback
// against a real policy directory and watcher; a policy that fails its
// own Rego tests is refused with its diagnostics and the one in force
// stays.
func TestPolicyEndpoints(t *testing.T) {
	f := newFixture(t, 10, Limits{MutationsPerSecond: 1000, MutationBurst: 1000})
	good := readFS(t, rego.Default())
	w := f.do("GET", "/api/v1/policy", nil)
	before := decode[PolicyStatus](t, w.Body.Bytes())
	if w.Code != 200 || before.Revision == "" || len(before.Files) == 0 {
		t.Fatalf("policy: %d %s", w.Code, w.Body)
	}
	// The files' text, for the console's editor; not in /status, which
	// every stream event carries.
	view := decode[PolicyView](t, w.Body.Bytes())
	if len(view.Sources) != len(good) || view.Sources["policy.rego"] != string(good["policy.rego"]) {
		t.Errorf("policy sources: %d files, want %d with policy.rego's text", len(view.Sources), len(good))
	}
	if st := f.do("GET", "/api/v1/status", nil); strings.Contains(st.Body.String(), `"sources"`) {
		t.Error("/status carries the policy's sources")
	}

	// A policy whose own test fails.
	failing := clone(good)
	failing["policy_test.rego"] = append(failing["policy_test.rego"], []byte("\ntest_always_fails if {\n\t1 == 2\n}\n")...)
	w = f.do("POST", "/api/v1/policy/validate", policyBody(t, failing))
	v := decode[ValidateResult](t, w.Body.Bytes())
	if w.Code != 200 || v.Valid || len(v.Diagnostics) != 1 || !strings.Contains(v.Diagnostics[0].Message, "test_always_fails") || v.Diagnostics[0].Row == 0 {
		t.Errorf("validate failing: %d %s", w.Code, w.Body)
	}
	w = f.do("POST", "/api/v1/policy/apply", policyBody(t, failing))
	e := decode[apiError](t, w.Body.Bytes())
	if w.Code != 422 || !strings.Contains(e.Error, "policy in force is unchanged") || len(e.Details) != 1 ||
		!strings.Contains(e.Details[0], "policy_test.rego:") || !strings.Contains(e.Details[0], "test_always_fails") {
		t.Errorf("apply failing: %d %s", w.Code, w.Body)
	}
	if now := f.pol.Status(); now.Revision != before.Revision || len(now.Diagnostics) != 1 {
		t.Errorf("policy after a refused apply: %+v", now)
	}
	// Two failing tests: the message counts them and names the first.
	twice := clone(failing)
	twice["policy_test.rego"] = append(twice["policy_test.rego"], []byte("\ntest_fails_too if {\n\t1 == 3\n}\n")...)
	w = f.do("POST", "/api/v1/policy/dry-run", policyBody(t, twice))
	e = decode[apiError](t, w.Body.Bytes())
	if w.Code != 422 || !strings.Contains(e.Error, "refused: 2 problems, the first policy_test.rego:") || strings.Contains(e.Error, "errors:;") ||
		len(e.Details) != 2 {
		t.Errorf("dry-run failing twice: %d %s", w.Code, w.Body)
	}

	// A policy that does not compile: diagnostics with file:row:col.
	broken := clone(good)
	broken["policy.rego"] = []byte("package arbiter\n\nclassify := {\n")
	w = f.do("POST", "/api/v1/policy/validate", policyBody(t, broken))
	v = decode[ValidateResult](t, w.Body.Bytes())
	if v.Valid || len(v.Diagnostics) == 0 || v.Diagnostics[0].File != "policy.rego" || v.Diagnostics[0].Row == 0 {
		t.Errorf("validate broken: %s", w.Body)
	}
	if w = f.do("POST", "/api/v1/policy/dry-run", policyBody(t, broken)); w.Code != 422 {
		t.Errorf("dry-run broken: %d %s", w.Code, w.Body)
	}

	// A good change: everything latency-critical.
	lc := clone(good)
	lc["policy.rego"] = []byte(strings.Replace(string(good["policy.rego"]),
		`default_decision := lib.with_reason(lib.classes["best-effort"], "default: nothing asked for another class")`,
		`default_decision := lib.with_reason(lib.classes["latency-critical"], "everything serves")`, 1))
	delete(lc, "policy_test.rego")
	w = f.do("POST", "/api/v1/policy/validate", policyBody(t, lc))
	if v = decode[ValidateResult](t, w.Body.Bytes()); !v.Valid {
		t.Fatalf("validate good: %s", w.Body)
	}
	w = f.do("POST", "/api/v1/policy/dry-run", policyBody(t, lc))
	dr := decode[DryRunResult](t, w.Body.Bytes())
	if w.Code != 200 || len(dr.Processes) != 10 || dr.Changed != 9 {
		t.Errorf("dry-run: %d changed of %d: %s", dr.Changed, len(dr.Processes), w.Body)
	}
	w = f.do("POST", "/api/v1/policy/apply", policyBody(t, lc))
	applied := decode[AppliedResult](t, w.Body.Bytes())
	if w.Code != 200 || applied.Revision == "" || applied.Revision == before.Revision {
		t.Fatalf("apply: %d %s", w.Code, w.Body)
	}
	if now := decode[PolicyStatus](t, f.do("GET", "/api/v1/policy", nil).Body.Bytes()); now.Revision != applied.Revision || now.Reloads != 1 {
		t.Errorf("after apply: %+v", now)
	}
	w = f.do("GET", "/api/v1/policy/history", nil)
	h := decode[struct{ Revisions []PolicyRevision }](t, w.Body.Bytes())
	if len(h.Revisions) != 2 || h.Revisions[0].Revision != applied.Revision || !h.Revisions[0].Current || h.Revisions[1].Origin != "startup" {
		t.Errorf("history: %s", w.Body)
	}
	w = f.do("POST", "/api/v1/policy/rollback", `{"revision": "`+before.Revision+`"}`)
	if r := decode[AppliedResult](t, w.Body.Bytes()); w.Code != 200 || r.Revision != before.Revision {
		t.Errorf("rollback: %d %s", w.Code, w.Body)
	}
	if f.pol.w.Policy().Revision() != before.Revision {
		t.Error("the watcher does not hold the rolled-back policy")
	}
}

// TestNoPolicyService: without a service the policy endpoints say why.
func TestNoPolicyService(t *testing.T) {
	f := newFixture(t, 1, Limits{})
	f.s.opts.Policy = nil
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/api/v1/policy", ""}, {"GET", "/api/v1/policy/history", ""},
		{"POST", "/api/v1/policy/apply", `{"files":{"a.rego":"package a"}}`}, {"POST", "/api/v1/policy/rollback", `{"revision":"x"}`},
	} {
		var body any
		if c.body != "" {
			body = c.body
		}
		if w := f.do(c.method, c.path, body); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "without a policy directory") {
			t.Errorf("%s %s: %d %s", c.method, c.path, w.Code, w.Body)
		}
	}
}

// TestProbes: /healthz always, /readyz only after SetReady(true).
func TestProbes(t *testing.T) {
	f := newFixture(t, 1, Limits{})
	if w := f.do("GET", "/healthz", nil); w.Code != 200 {
		t.Errorf("healthz %d", w.Code)
	}
	if w := f.do("GET", "/readyz", nil); w.Code != 503 {
		t.Errorf("readyz before ready: %d", w.Code)
	}
	f.s.SetReady(true)
	if w := f.do("GET", "/readyz", nil); w.Code != 200 {
		t.Errorf("readyz when ready: %d", w.Code)
	}
}

// TestConsoleMount: with a console, every path outside the API, the
// probes and /metrics goes to it, with the security headers; the API's
// own unknown paths still get the API's JSON 404.
func TestConsoleMount(t *testing.T) {
	f := newFixture(t, 1, Limits{})
	f.s.opts.Console = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("console " + r.URL.Path))
	})
	for path, want := range map[string]string{"/": "console /", "/static/app.js": "console /static/app.js",
		"/api/v1/nope": "no such endpoint", "/healthz": `"ok"`, "/api/v1/status": `"hostname":"node1"`, "/metrics": "arbiter_ready"} {
		w := f.do("GET", path, nil)
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("GET %s: %d %.80s, want %q", path, w.Code, w.Body, want)
		}
		if w.Header().Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no Content-Security-Policy", path)
		}
	}
}

// TestStatusGPUsWithoutNVML: on a node where NVML lists no GPU, the
// status names the GPUs the engine sees, as /gpus does, so that status and
// ps agree.
func TestStatusGPUsWithoutNVML(t *testing.T) {
	f := newFixture(t, 40, Limits{})
	f.s.opts.Node.GPUs = nil
	f.eng.waitFor(t, func(s *engineSnapshot) bool { return len(s.GPUs) == 2 })
	st := decode[StatusView](t, f.do("GET", "/api/v1/status", nil).Body.Bytes())
	g := decode[struct{ GPUs []GPUItem }](t, f.do("GET", "/api/v1/gpus", nil).Body.Bytes())
	if len(st.Node.GPUs) != 2 || st.Node.GPUs[0].Index != 0 || st.Node.GPUs[1].Index != 1 || len(g.GPUs) != 2 {
		t.Errorf("status GPUs %+v, /gpus %+v: want GPUs 0 and 1 in both", st.Node.GPUs, g.GPUs)
	}
}
