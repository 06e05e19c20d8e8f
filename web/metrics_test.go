package web

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/engine"
)

// gather scrapes the fixture's registry into families by name.
func gather(t *testing.T, f *fixture) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := f.s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// TestMetrics: the families carry the snapshot's numbers, the
// histogram comes from the engine's own distribution, labels are bounded
// (no pid, no comm), and the exposition passes Prometheus's lint.
func TestMetrics(t *testing.T) {
	f := newFixture(t, 40, Limits{})
	f.eng.waitFor(t, func(s *engineSnapshot) bool { return s.Stats.Requests >= 12 })
	f.s.SetReady(true)
	f.do("GET", "/api/v1/no-such-"+strings.Repeat("x", 20), nil)
	f.do("FROBNICATE", "/api/v1/status", nil)
	w := f.do("GET", "/metrics", nil)
	if w.Code != 200 || !strings.Contains(w.Body.String(), "arbiter_engine_events_total") {
		t.Fatalf("/metrics: %d", w.Code)
	}
	fams := gather(t, f)
	for _, name := range []string{"arbiter_processes", "arbiter_class_request_duration_seconds", "arbiter_class_requests_within_slo_total",
		"arbiter_class_slo_attainment_ratio", "arbiter_gpu_processes", "arbiter_enforcement_actions_total", "arbiter_capture_dropped_events_total",
		"arbiter_policy_reloads_total", "arbiter_ready", "go_goroutines", "process_cpu_seconds_total"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	for name, want := range map[string]float64{"arbiter_gate_stops_total": 3, "arbiter_gate_stop_failures_total": 5, "arbiter_gate_armed_closes_total": 4} {
		if mf := fams[name]; mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetCounter().GetValue() != want {
			t.Errorf("%s: %v, want one counter at %v", name, mf, want)
		}
	}
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			for l, v := range labelsOf(m) {
				if l == "pid" || l == "comm" || strings.Contains(v, "no-such") || v == "FROBNICATE" {
					t.Errorf("%s has an unbounded label %s=%q", name, l, v)
				}
			}
		}
	}
	var lcRunning float64
	for _, m := range fams["arbiter_processes"].GetMetric() {
		if l := labelsOf(m); l["class"] == "latency-critical" && l["state"] == "running" && l["level"] == "timeslice" {
			lcRunning = m.GetGauge().GetValue()
		}
	}
	if lcRunning != 4 {
		t.Errorf("arbiter_processes{latency-critical,running,timeslice} = %v, want 4", lcRunning)
	}
	var hist *dto.Histogram
	for _, m := range fams["arbiter_class_request_duration_seconds"].GetMetric() {
		if labelsOf(m)["class"] == "latency-critical" {
			hist = m.GetHistogram()
		}
	}
	if hist == nil || hist.GetSampleCount() < 12 || hist.GetSampleSum() <= 0 {
		t.Fatalf("LC histogram: %v", hist)
	}
	// Every request took 0.5 ms plus scheduling: none at or below 250 µs,
	// all at or below 10 s.
	for _, b := range hist.GetBucket() {
		if b.GetUpperBound() <= 0.00025 && b.GetCumulativeCount() != 0 || b.GetUpperBound() == 10 && b.GetCumulativeCount() != hist.GetSampleCount() {
			t.Errorf("bucket le=%v: %d of %d", b.GetUpperBound(), b.GetCumulativeCount(), hist.GetSampleCount())
		}
	}
	for _, m := range fams["arbiter_gpu_processes"].GetMetric() {
		if l := labelsOf(m); l["uuid"] != "GPU-aaaa" && l["uuid"] != "GPU-bbbb" {
			t.Errorf("GPU metric without its UUID: %v", l)
		}
	}
	problems, err := testutil.GatherAndLint(f.s.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "arbiter_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

// exported lists every series name the server can export: the
// collector's families (histograms with their suffixes), the HTTP
// metrics, and what a populated registry gathers (Go and process).
func exported(t *testing.T) map[string]bool {
	f := newFixture(t, 20, Limits{})
	f.eng.waitFor(t, func(s *engineSnapshot) bool { return s.Stats.Requests >= 6 })
	f.do("GET", "/api/v1/status", nil)
	names := map[string]bool{"up": true}
	add := func(name string, typ dto.MetricType) {
		names[name] = true
		switch typ {
		case dto.MetricType_HISTOGRAM:
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[name+"_sum"], names[name+"_count"] = true, true
		}
	}
	for _, m := range metricFamilies() {
		typ := dto.MetricType_GAUGE
		if m.name == "arbiter_class_request_duration_seconds" {
			typ = dto.MetricType_HISTOGRAM
		}
		add(m.name, typ)
	}
	for name, mf := range gather(t, f) {
		add(name, mf.GetType())
	}
	return names
}

// selectors returns the metric names an expression selects.
func selectors(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("parse %q: %v", expr, err)
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}

// grafanaVars replaces the dashboard's template variables with values, so
// that its expressions parse as PromQL.
var grafanaVars = regexp.MustCompile(`\$\{?(\w+)\}?`)

// TestDashboardMetricsExist: every metric the dashboard's queries select
// exists in the registry or is recorded by the shipped rules.
func TestDashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile("../deploy/grafana/arbiter-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	names := exported(t)
	for _, r := range rules(t) {
		names[r] = true
	}
	var exprs int
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			for _, name := range selectors(t, grafanaVars.ReplaceAllString(tg.Expr, "x")) {
				if !names[name] {
					t.Errorf("panel %q selects %s, which nothing exports", p.Title, name)
				}
			}
		}
	}
	if dash.UID == "" || exprs < 20 {
		t.Errorf("dashboard %q: %d queries", dash.UID, exprs)
	}
}

// rules parses the shipped rules with Prometheus's own parser and returns
// the names they record.
func rules(t *testing.T) []string {
	t.Helper()
	groups, errs := rulefmt.ParseFile("../deploy/prometheus/arbiter-rules.yaml", false, model.UTF8Validation,
		parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.Fatal("no rule groups")
	}
	var recorded []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded = append(recorded, r.Record)
			}
		}
	}
	return recorded
}

// TestAlertRules: the rules parse; they alert on both burn rates with
// both windows each, on the daemon being down, on enforcement failures,
// on a refused policy and on a bundle server out of reach or never
// good; and every metric they select exists.
func TestAlertRules(t *testing.T) {
	recorded := rules(t)
	groups, _ := rulefmt.ParseFile("../deploy/prometheus/arbiter-rules.yaml", false, model.UTF8Validation,
		parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	names := exported(t)
	for _, r := range recorded {
		names[r] = true
	}
	alerts := map[string]string{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			for _, name := range selectors(t, r.Expr) {
				if !names[name] {
					t.Errorf("rule %s%s selects %s, which nothing exports or records", r.Alert, r.Record, name)
				}
			}
			if r.Alert != "" {
				alerts[r.Alert] = r.Expr
			}
		}
	}
	for alert, want := range map[string][]string{
		"ArbiterSLOBurnRateFast":         {"14.4", "ratio_rate1h", "ratio_rate5m"},
		"ArbiterSLOBurnRateSlow":         {"6 *", "ratio_rate6h", "ratio_rate30m"},
		"ArbiterDown":                    {"up{"},
		"ArbiterEnforcementFailing":      {"arbiter_enforcement_failures_total", "arbiter_gate_stop_failures_total"},
		"ArbiterPolicyReloadFailing":     {"arbiter_policy_last_reload_success"},
		"ArbiterPolicyBundleUnreachable": {"arbiter_policy_bundle_consecutive_failures"},
		"ArbiterPolicyObserveOnly":       {`arbiter_policy_bundle_info{origin="fallback"}`},
	} {
		for _, w := range want {
			if !strings.Contains(alerts[alert], w) {
				t.Errorf("alert %s: %q does not contain %q", alert, alerts[alert], w)
			}
		}
	}
	if !slices.Contains(recorded, "arbiter:class_slo_error_budget:ratio") {
		t.Error("no error budget recording rule")
	}
}

// TestMetricsStoppedEngine: an engine loop that does not answer costs
// one scrape the histogram timeout; later scrapes leave the histograms
// out at once instead of queueing more work on it.
func TestMetricsStoppedEngine(t *testing.T) {
	e, err := engine.New(newLiveSource(), nil, nil) // never run
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Snapshots: e, TokenFile: filepath.Join(t.TempDir(), "tok"), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	scrape := func() time.Duration {
		start := time.Now()
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		if w.Code != 200 || !strings.Contains(w.Body.String(), "arbiter_engine_events_total 0") {
			t.Fatalf("scrape: %d %s", w.Code, w.Body)
		}
		return time.Since(start)
	}
	if d := scrape(); d < histogramTimeout {
		t.Errorf("first scrape took %v: the engine answered although it never ran", d)
	}
	if d := scrape(); d > time.Second {
		t.Errorf("second scrape took %v: it waited for the stopped engine again", d)
	}
}
