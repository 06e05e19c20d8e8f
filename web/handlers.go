package web

import (
	_ "embed"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/gpu-arbiter/arbiter/engine"
)

// openAPI is the API's OpenAPI 3 description (docs/openapi.yaml is the
// same file; a test keeps them equal and checks it against the routes).
//
//go:embed openapi.yaml
var openAPI []byte

// APIPrefix is where the API lives.
const APIPrefix = "/api/v1"

// maxListLimit caps ?limit= on the decision lists.
const maxListLimit = 10000

// routes builds the echo instance with every route.
func (s *Server) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.IPExtractor = echo.ExtractIPDirect()
	e.HTTPErrorHandler = s.handleError
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisableStackAll: true, DisablePrintStack: true,
		LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
			s.log.Error().Err(err).Bytes("stack", stack).Str("path", c.Request().URL.Path).Msg("api handler panicked")
			return err
		}}))
	e.Use(s.instrument)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(s.metricsHandler()))

	api := e.Group(APIPrefix)
	api.GET("/openapi.yaml", s.openapi)
	api.GET("/status", s.getStatus)
	api.GET("/processes", s.getProcesses)
	api.GET("/processes/:pid", s.getProcess)
	api.GET("/classes", s.getClasses)
	api.GET("/gpus", s.getGPUs)
	api.GET("/decisions", s.getDecisions)
	api.GET("/preemptions", s.getPreemptions)
	api.GET("/events", s.events)
	api.GET("/policy", s.getPolicy)
	api.GET("/policy/history", s.getPolicyHistory)
	api.POST("/policy/validate", s.validatePolicy, s.mutation)
	api.POST("/policy/dry-run", s.dryRunPolicy, s.mutation)
	api.POST("/policy/apply", s.applyPolicy, s.mutation)
	api.POST("/policy/rollback", s.rollbackPolicy, s.mutation)
	return e
}

// Routes lists the registered routes as "METHOD path" (echo's :param
// syntax), for tests and documentation checks.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.echo.Routes() {
		if r.Method == echo.RouteNotFound {
			continue
		}
		out = append(out, r.Method+" "+r.Path)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	if !s.ready.Load() {
		return errorf(http.StatusServiceUnavailable, "not ready: the daemon is still starting (engine or policy not up yet)")
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) openapi(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/yaml", openAPI)
}

func (s *Server) getStatus(c echo.Context) error {
	if err := onlyParams(c.QueryParams()); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.status(s.view()))
}

// ProcessList is the body of GET /processes.
type ProcessList struct {
	Time      uint64        `json:"time"`
	Processes []ProcessItem `json:"processes"`
}

func (s *Server) getProcesses(c echo.Context) error {
	q := c.QueryParams()
	if err := onlyParams(q, "class", "state"); err != nil {
		return err
	}
	for _, k := range []string{"class", "state"} {
		if q.Has(k) && q.Get(k) == "" {
			return errorf(http.StatusBadRequest, "%s: empty: give a value, or leave the parameter out for every process", k)
		}
	}
	state := q.Get("state")
	if state != "" && state != "running" && state != "suspended" && state != "gated" {
		return errorf(http.StatusBadRequest, "state %q: want running, suspended or gated", state)
	}
	if len(q.Get("class")) > 256 {
		return errorf(http.StatusBadRequest, "class name longer than 256 characters")
	}
	v := s.view()
	return c.JSON(http.StatusOK, ProcessList{Time: v.snap.Time, Processes: v.processes(q.Get("class"), state)})
}

func (s *Server) getProcess(c echo.Context) error {
	if err := onlyParams(c.QueryParams()); err != nil {
		return err
	}
	pid, err := strconv.ParseUint(c.Param("pid"), 10, 32)
	if err != nil || pid == 0 {
		return errorf(http.StatusBadRequest, "pid %q: want a positive integer", c.Param("pid"))
	}
	v := s.view()
	for i := range v.snap.Processes {
		if p := &v.snap.Processes[i]; p.PID == uint32(pid) {
			return c.JSON(http.StatusOK, v.process(p))
		}
	}
	return errorf(http.StatusNotFound, "pid %d is not a CUDA process the engine knows (it may have exited)", pid)
}

func (s *Server) getClasses(c echo.Context) error {
	if err := onlyParams(c.QueryParams()); err != nil {
		return err
	}
	v := s.view()
	return c.JSON(http.StatusOK, map[string]any{"time": v.snap.Time, "classes": v.classes()})
}

func (s *Server) getGPUs(c echo.Context) error {
	if err := onlyParams(c.QueryParams()); err != nil {
		return err
	}
	v := s.view()
	return c.JSON(http.StatusOK, map[string]any{"time": v.snap.Time, "driver_version": s.opts.Node.DriverVersion, "gpus": s.gpus(v)})
}

// DecisionList is the body of GET /decisions and GET /preemptions.
type DecisionList struct {
	// Time is the engine's clock at the snapshot: pass it as ?since= to
	// get only later ones next time.
	Time uint64 `json:"time"`
	// Total counts every one ever recorded; the list keeps the latest.
	Total     uint64            `json:"total"`
	Decisions []engine.Decision `json:"decisions"`
}

func (s *Server) getDecisions(c echo.Context) error {
	v := s.view()
	return decisionList(c, v.snap.Time, v.snap.DecisionsTotal, v.snap.Decisions)
}

func (s *Server) getPreemptions(c echo.Context) error {
	v := s.view()
	return decisionList(c, v.snap.Time, v.snap.PreemptionsTotal, v.snap.Preemptions)
}

// decisionList answers with the decisions after ?since= (engine time,
// ns), the latest ?limit= of them.
func decisionList(c echo.Context, now, total uint64, all []engine.Decision) error {
	q := c.QueryParams()
	if err := onlyParams(q, "since", "limit"); err != nil {
		return err
	}
	var since uint64
	if s := q.Get("since"); s != "" {
		var err error
		if since, err = strconv.ParseUint(s, 10, 64); err != nil {
			return errorf(http.StatusBadRequest, "since %q: want the engine time in ns from an earlier answer's \"time\"", s)
		}
	}
	limit := maxListLimit
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			return errorf(http.StatusBadRequest, "limit %q: want 1 to %d", l, maxListLimit)
		}
		limit = n
	}
	out := make([]engine.Decision, 0, len(all))
	for _, d := range all {
		if d.Time > since || since == 0 {
			out = append(out, d)
		}
	}
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return c.JSON(http.StatusOK, DecisionList{Time: now, Total: total, Decisions: out})
}

// onlyParams refuses query parameters other than those named, so that a
// misspelt filter is an error rather than silently ignored.
func onlyParams(q url.Values, allowed ...string) error {
	for k, vs := range q {
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return errorf(http.StatusBadRequest, "unknown query parameter %q: this endpoint takes none", k)
			}
			return errorf(http.StatusBadRequest, "unknown query parameter %q: want one of %v", k, allowed)
		}
		if len(vs) > 1 {
			return errorf(http.StatusBadRequest, "query parameter %q given %d times", k, len(vs))
		}
	}
	return nil
}
