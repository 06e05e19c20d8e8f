package web

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpu-arbiter/arbiter/engine"
)

// LatencyBuckets are the upper bounds, in seconds, of the exported
// request-latency histograms: 100 µs to 10 s.
func LatencyBuckets() []float64 {
	return []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
}

// histogramTimeout bounds the wait for the engine loop's histograms;
// histogramRetry is how long an engine loop that did not answer is left
// alone.
const (
	histogramTimeout = 2 * time.Second
	histogramRetry   = 30 * time.Second
)

// registerMetrics fills the server's own registry: the snapshot
// collector, the HTTP metrics, and the Go runtime and process collectors.
func (s *Server) registerMetrics() (*httpMetrics, error) {
	hm := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "arbiter_http_requests_total",
			Help: "API requests answered, by route, method and status code."}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "arbiter_http_request_duration_seconds",
			Help: "Time to answer an API request (event streams excluded), by route.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9)},
			[]string{"route"}),
	}
	for _, c := range []prometheus.Collector{newCollector(s), hm.requests, hm.duration,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := s.reg.Register(c); err != nil {
			return nil, err
		}
	}
	return hm, nil
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// httpMetrics count API requests.
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// instrument counts every request by its route template (never its raw
// path: bounded labels).
func (s *Server) instrument(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		code := c.Response().Status
		if err != nil {
			s.handleError(err, c)
			code = c.Response().Status
		}
		s.http.requests.WithLabelValues(route, methodLabel(c.Request().Method), strconv.Itoa(code)).Inc()
		if route != APIPrefix+"/events" {
			s.http.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
		}
		return nil
	}
}

// collector exports the engine's latest snapshot at scrape time. Labels
// are bounded: classes, states, levels, GPU index and UUID, never a pid
// or a command name.
type collector struct {
	s *Server
	d map[string]*prometheus.Desc
	// mu makes one histogram request to the engine at a time; failed is
	// when the last one went unanswered.
	mu     sync.Mutex
	failed time.Time
}

// metric is one exported family: name, help and variable labels.
type metric struct {
	name, help string
	labels     []string
}

var noLabels []string

func metricFamilies() []metric {
	cls := []string{"class"}
	return []metric{
		{"arbiter_build_info", "Always 1; the daemon's version as a label.", []string{"version"}},
		{"arbiter_ready", "1 when the daemon is ready (engine running, policy loaded).", noLabels},
		{"arbiter_start_time_seconds", "When the daemon started, Unix time.", noLabels},
		{"arbiter_processes", "CUDA processes the engine manages, by class, state and enforcement level.", []string{"class", "state", "level"}},
		{"arbiter_class_members", "Processes in a class.", cls},
		{"arbiter_class_escalated", "1 when a latency-critical class's requests suspend best-effort work, 0 when it relies on timeslices or is not latency-critical.", cls},
		{"arbiter_class_requests_total", "Requests the engine measured for a class.", cls},
		{"arbiter_class_request_latency_seconds", "Request latency percentiles of a class over the daemon's life (the engine's own: 0.5, 0.99, and 1 for the maximum).", cls},
		{"arbiter_class_request_duration_seconds", "Request latency of a class.", cls},
		{"arbiter_class_requests_within_slo_total", "Requests of a class that met its SLO's latency target.", cls},
		{"arbiter_class_slo_attainment_ratio", "Fraction of a class's requests within target over its SLO window (absent with no request in the window).", cls},
		{"arbiter_class_slo_target_ratio", "The fraction of requests a class's SLO wants within target.", cls},
		{"arbiter_class_slo_latency_target_seconds", "A class's SLO latency target.", cls},
		{"arbiter_class_slo_window_seconds", "A class's SLO window.", cls},
		{"arbiter_class_slo_window_requests", "Requests of a class in its SLO window.", cls},
		{"arbiter_class_max_gpu_share_ratio", "A class's GPU-time quota (1: none).", cls},
		{"arbiter_gpu_info", "Always 1; a GPU's index, UUID and name.", []string{"gpu", "uuid", "name"}},
		{"arbiter_gpu_processes", "CUDA processes on a GPU.", []string{"gpu", "uuid"}},
		{"arbiter_gpu_active_requests", "Latency-critical processes with a request in flight on a GPU.", []string{"gpu", "uuid"}},
		{"arbiter_gpu_held_processes", "Best-effort processes held off a GPU now.", []string{"gpu", "uuid"}},
		{"arbiter_engine_events_total", "Events the engine applied.", noLabels},
		{"arbiter_engine_processes_total", "Processes the engine has seen.", noLabels},
		{"arbiter_engine_classifications_total", "Policy classifications.", noLabels},
		{"arbiter_engine_classify_errors_total", "Classifications that fell back to the policy's default.", noLabels},
		{"arbiter_engine_requests_total", "Latency-critical requests started.", noLabels},
		{"arbiter_engine_victim_calls_total", "Calls of the policy's victims entry point.", noLabels},
		{"arbiter_engine_victim_errors_total", "Victim decisions that could not be used.", noLabels},
		{"arbiter_engine_escalations_total", "SLO feedback escalations.", noLabels},
		{"arbiter_engine_relaxations_total", "SLO feedback relaxations.", noLabels},
		{"arbiter_engine_harvests_skipped_total", "Idle gaps predicted too short to resume best-effort work in.", noLabels},
		{"arbiter_engine_decisions_total", "Decisions recorded (classifications, fallbacks, settings, escalations, failures).", noLabels},
		{"arbiter_engine_preemptions_total", "Preemptions recorded (suspensions, gates, holds and their undoing).", noLabels},
		{"arbiter_enforcement_actions_total", "Enforcement actions taken, by action.", []string{"action"}},
		{"arbiter_enforcement_failures_total", "Enforcement actions that failed.", noLabels},
		{"arbiter_capture_events_total", "Events the capture read from the kernel.", noLabels},
		{"arbiter_capture_dropped_events_total", "Events lost because the ring buffer was full.", noLabels},
		{"arbiter_capture_decode_errors_total", "Event records that did not decode.", noLabels},
		{"arbiter_gate_stops_total", "Processes the launch gate's probes stopped at a launch.", noLabels},
		{"arbiter_gate_stop_failures_total", "Stops the launch gate's probes did not make: the signal failed, or there was no room to record the stop.", noLabels},
		{"arbiter_gate_armed_closes_total", "Launch gates closed in the kernel by the call that opened an armed latency-critical request.", noLabels},
		{"arbiter_policy_info", "Always 1; the revision of the policy in force.", []string{"revision"}},
		{"arbiter_policy_reloads_total", "Policies applied since the daemon started.", noLabels},
		{"arbiter_policy_reload_failures_total", "Policies refused (load, check or Rego tests failed) since the daemon started.", noLabels},
		{"arbiter_policy_last_reload_success", "1 when the latest policy change was applied, 0 when it was refused.", noLabels},
		{"arbiter_policy_loaded_timestamp_seconds", "When the policy in force was loaded, Unix time.", noLabels},
		{"arbiter_policy_bundle_info", "Always 1 while the daemon polls a bundle server; where the policy in force came from (bundle, saved, fallback) and its signature (verified, unchecked, unsigned).", []string{"origin", "signature"}},
		{"arbiter_policy_bundle_fetches_total", "Fetches from the bundle server, by result (activated, not_modified, unchanged, rejected, failed).", []string{"result"}},
		{"arbiter_policy_bundle_failures_total", "Failed fetches and refused bundles, by reason (connection, timeout, http_status, token, too_large, bundle, signature, policy, tests).", []string{"reason"}},
		{"arbiter_policy_bundle_last_success_timestamp_seconds", "When the bundle server last answered (a bundle or 304), Unix time.", noLabels},
		{"arbiter_policy_bundle_consecutive_failures", "Fetches from the bundle server failed in a row.", noLabels},
		{"arbiter_stream_clients", "Event-stream clients connected.", noLabels},
		{"arbiter_stream_events_total", "Event-stream writes to clients.", noLabels},
		{"arbiter_stream_slow_clients_total", "Event-stream clients dropped for falling behind.", noLabels},
	}
}

func newCollector(s *Server) *collector {
	c := &collector{s: s, d: map[string]*prometheus.Desc{}}
	for _, m := range metricFamilies() {
		c.d[m.name] = prometheus.NewDesc(m.name, m.help, m.labels, nil)
	}
	return c
}

// Describe sends every family's description.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.d {
		ch <- d
	}
}

// Collect reads the latest snapshot and sends its metrics.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	snap := s.opts.Snapshots.Snapshot()
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.d[name], prometheus.GaugeValue, v, labels...)
	}
	counter := func(name string, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.d[name], prometheus.CounterValue, float64(v), labels...)
	}
	gauge("arbiter_build_info", 1, s.opts.Version)
	gauge("arbiter_ready", b2f(s.ready.Load()))
	gauge("arbiter_start_time_seconds", float64(s.started.UnixNano())/1e9)

	type key struct{ class, state, level string }
	procs := map[key]int{}
	for i := range snap.Processes {
		p := &snap.Processes[i]
		procs[key{p.Class, p.State.String(), p.Level.String()}]++
	}
	for k, n := range procs {
		gauge("arbiter_processes", float64(n), k.class, k.state, k.level)
	}
	c.classes(snap, gauge, counter, ch)
	c.gpus(snap, gauge)
	c.engine(snap, counter)
	if s.opts.Capture != nil {
		cs := s.opts.Capture()
		counter("arbiter_capture_events_total", cs.Events)
		counter("arbiter_capture_dropped_events_total", cs.Dropped)
		counter("arbiter_capture_decode_errors_total", cs.DecodeErrors)
		counter("arbiter_gate_stops_total", cs.GateStops)
		counter("arbiter_gate_stop_failures_total", cs.GateStopFailures)
		counter("arbiter_gate_armed_closes_total", cs.GateArmedCloses)
	}
	if s.opts.Policy != nil {
		ps := s.opts.Policy.Status()
		gauge("arbiter_policy_info", 1, ps.Revision)
		counter("arbiter_policy_reloads_total", uint64(ps.Reloads))
		counter("arbiter_policy_reload_failures_total", uint64(ps.Rejected))
		gauge("arbiter_policy_last_reload_success", b2f(ps.LastError == ""))
		if !ps.LoadedAt.IsZero() {
			gauge("arbiter_policy_loaded_timestamp_seconds", float64(ps.LoadedAt.UnixNano())/1e9)
		}
		if b := ps.Bundle; b != nil {
			c.bundle(b, gauge, counter)
		}
	}
	gauge("arbiter_stream_clients", float64(s.hub.clients.Load()))
	counter("arbiter_stream_events_total", s.hub.sent.Load())
	counter("arbiter_stream_slow_clients_total", s.hub.slow.Load())
}

type (
	gaugeFunc   func(name string, v float64, labels ...string)
	counterFunc func(name string, v uint64, labels ...string)
)

func (c *collector) classes(snap *engine.Snapshot, gauge gaugeFunc, counter counterFunc, ch chan<- prometheus.Metric) {
	hists := c.histograms()
	for _, cl := range snap.Classes {
		l := cl.Latency
		gauge("arbiter_class_members", float64(cl.Members), cl.Name)
		gauge("arbiter_class_escalated", b2f(cl.Escalated), cl.Name)
		gauge("arbiter_class_max_gpu_share_ratio", cl.MaxGPUShare, cl.Name)
		h, ok := hists[cl.Name]
		if ok {
			counter("arbiter_class_requests_total", h.Count, cl.Name) // consistent with the within count
		} else {
			counter("arbiter_class_requests_total", l.Requests, cl.Name)
		}
		if l.Requests > 0 {
			// The engine's own percentiles over the daemon's life, as a
			// summary; the sum is known only with the histogram.
			var sum float64
			if ok {
				sum = h.Sum
			}
			ch <- prometheus.MustNewConstSummary(c.d["arbiter_class_request_latency_seconds"], l.Requests, sum,
				map[float64]float64{0.5: l.P50.Seconds(), 0.99: l.P99.Seconds(), 1: l.Max.Seconds()}, cl.Name)
		}
		if ok {
			buckets := make(map[float64]uint64, len(h.Bounds))
			for i, b := range h.Bounds {
				buckets[b] = h.Counts[i]
			}
			ch <- prometheus.MustNewConstHistogram(c.d["arbiter_class_request_duration_seconds"], h.Count, h.Sum, buckets, cl.Name)
		}
		if !l.HasSLO {
			continue
		}
		if ok {
			counter("arbiter_class_requests_within_slo_total", h.Within, cl.Name)
		}
		if l.Attainment >= 0 {
			gauge("arbiter_class_slo_attainment_ratio", l.Attainment, cl.Name)
		}
		gauge("arbiter_class_slo_target_ratio", l.Percentile/100, cl.Name)
		gauge("arbiter_class_slo_latency_target_seconds", l.Target.Seconds(), cl.Name)
		gauge("arbiter_class_slo_window_seconds", l.Window.Seconds(), cl.Name)
		gauge("arbiter_class_slo_window_requests", float64(l.WindowRequests), cl.Name)
	}
}

// histograms asks the engine for its classes' histograms, one scrape at
// a time, waiting at most histogramTimeout. An engine loop that did not
// answer (stopped, or stalled) is not asked again for histogramRetry, so
// that scrapes stay fast and do not queue work on a loop that is not
// running; the histogram families are left out meanwhile.
func (c *collector) histograms() map[string]engine.LatencyHistogram {
	hs, ok := c.s.opts.Snapshots.(HistogramSource)
	if !ok {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.failed.IsZero() && time.Since(c.failed) < histogramRetry {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), histogramTimeout)
	defer cancel()
	m, err := hs.LatencyHistograms(ctx, LatencyBuckets())
	if err != nil {
		c.failed = time.Now()
		c.s.log.Warn().Err(err).Dur("retry_in", histogramRetry).Msg("latency histograms left out of /metrics")
		return nil
	}
	c.failed = time.Time{}
	return m
}

// bundle exports the bundle server's side of the policy. Its labels are
// the bounded sets the status keys are drawn from.
func (c *collector) bundle(b *BundleStatus, gauge gaugeFunc, counter counterFunc) {
	gauge("arbiter_policy_bundle_info", 1, b.Origin, b.Signature)
	for result, n := range b.Fetches {
		counter("arbiter_policy_bundle_fetches_total", n, result)
	}
	for reason, n := range b.Failures {
		counter("arbiter_policy_bundle_failures_total", n, reason)
	}
	if !b.LastSuccessAt.IsZero() {
		gauge("arbiter_policy_bundle_last_success_timestamp_seconds", float64(b.LastSuccessAt.UnixNano())/1e9)
	}
	gauge("arbiter_policy_bundle_consecutive_failures", float64(b.ConsecutiveFailures))
}

func (c *collector) gpus(snap *engine.Snapshot, gauge gaugeFunc) {
	node := &c.s.opts.Node
	for _, g := range node.GPUs {
		gauge("arbiter_gpu_info", 1, strconv.Itoa(g.Index), g.UUID, g.Name)
	}
	for _, g := range snap.GPUs {
		ng, _ := node.gpu(g.Index)
		idx := strconv.Itoa(g.Index)
		gauge("arbiter_gpu_processes", float64(g.Processes), idx, ng.UUID)
		gauge("arbiter_gpu_active_requests", float64(len(g.Active)), idx, ng.UUID)
		gauge("arbiter_gpu_held_processes", float64(len(g.Held)), idx, ng.UUID)
	}
}

func (c *collector) engine(snap *engine.Snapshot, counter counterFunc) {
	st := snap.Stats
	counter("arbiter_engine_events_total", st.Events)
	counter("arbiter_engine_processes_total", st.Processes)
	counter("arbiter_engine_classifications_total", st.Classifications)
	counter("arbiter_engine_classify_errors_total", st.ClassifyErrors)
	counter("arbiter_engine_requests_total", st.Requests)
	counter("arbiter_engine_victim_calls_total", st.VictimCalls)
	counter("arbiter_engine_victim_errors_total", st.VictimErrors)
	counter("arbiter_engine_escalations_total", st.Escalations)
	counter("arbiter_engine_relaxations_total", st.Relaxes)
	counter("arbiter_engine_harvests_skipped_total", st.HarvestsSkipped)
	counter("arbiter_engine_decisions_total", snap.DecisionsTotal)
	counter("arbiter_engine_preemptions_total", snap.PreemptionsTotal)
	for action, n := range map[engine.Action]uint64{engine.ActionSuspend: st.Suspends, engine.ActionResume: st.Resumes,
		engine.ActionGate: st.Gates, engine.ActionUngate: st.Ungates, engine.ActionTimeslice: st.Timeslices,
		engine.ActionInterleave: st.Interleaves, engine.ActionArm: st.Arms} {
		counter("arbiter_enforcement_actions_total", n, string(action))
	}
	counter("arbiter_enforcement_failures_total", st.EnforceErrors)
}

// methodLabel bounds the method label: any method a client makes up
// counts as "other".
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return m
	}
	return "other"
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
