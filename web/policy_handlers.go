package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gpu-arbiter/arbiter/policy"
)

// policyTimeout bounds one policy operation (load, check, tests, reload).
const policyTimeout = 60 * time.Second

// PolicyRequest is the body of POST /policy/validate, /dry-run and
// /apply: the policy's files by relative path, as text.
type PolicyRequest struct {
	Files map[string]string `json:"files"`
}

// RollbackRequest is the body of POST /policy/rollback.
type RollbackRequest struct {
	Revision string `json:"revision"`
}

// decodePolicyRequest reads and checks a policy request body.
func decodePolicyRequest(b []byte) (PolicyFiles, error) {
	var req PolicyRequest
	if err := decodeBody(b, &req); err != nil {
		return nil, err
	}
	files := make(PolicyFiles, len(req.Files))
	for name, text := range req.Files {
		files[name] = []byte(text)
	}
	if err := files.Check(); err != nil {
		return nil, errorf(http.StatusBadRequest, "%v", err)
	}
	return files, nil
}

// decodeRollbackRequest reads and checks a rollback request body.
func decodeRollbackRequest(b []byte) (string, error) {
	var req RollbackRequest
	if err := decodeBody(b, &req); err != nil {
		return "", err
	}
	if req.Revision == "" || len(req.Revision) > 256 {
		return "", errorf(http.StatusBadRequest, "revision: want one of the revisions GET %s/policy/history lists", APIPrefix)
	}
	return req.Revision, nil
}

// PolicyView is the body of GET /policy: the status, and the text of the
// policy's files where the service gives it (PolicySources).
type PolicyView struct {
	PolicyStatus
	// Sources are the files by relative path, as text.
	Sources map[string]string `json:"sources,omitempty"`
}

func (s *Server) getPolicy(c echo.Context) error {
	if err := s.policyService(c); err != nil {
		return err
	}
	v := PolicyView{PolicyStatus: s.opts.Policy.Status()}
	if ps, ok := s.opts.Policy.(PolicySources); ok {
		files, err := ps.Sources()
		if err != nil {
			return err
		}
		for name, b := range files {
			if v.Sources == nil {
				v.Sources = map[string]string{}
			}
			v.Sources[name] = string(b)
		}
	}
	return c.JSON(http.StatusOK, v)
}

func (s *Server) getPolicyHistory(c echo.Context) error {
	if err := s.policyService(c); err != nil {
		return err
	}
	h := s.opts.Policy.History()
	if h == nil {
		h = []PolicyRevision{}
	}
	return c.JSON(http.StatusOK, map[string]any{"revisions": h})
}

// ValidateResult is the answer of POST /policy/validate.
type ValidateResult struct {
	Valid       bool                `json:"valid"`
	Diagnostics []policy.Diagnostic `json:"diagnostics"`
}

func (s *Server) validatePolicy(c echo.Context) error {
	files, err := s.policyBody(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), policyTimeout)
	defer cancel()
	diags, err := s.opts.Policy.Validate(ctx, files)
	if err != nil {
		return policyError(err, "validate")
	}
	if diags == nil {
		diags = []policy.Diagnostic{}
	}
	return c.JSON(http.StatusOK, ValidateResult{Valid: len(diags) == 0, Diagnostics: diags})
}

// DryRunResult is the answer of POST /policy/dry-run.
type DryRunResult struct {
	Changed   int           `json:"changed"`
	Processes []ClassChange `json:"processes"`
}

func (s *Server) dryRunPolicy(c echo.Context) error {
	files, err := s.policyBody(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), policyTimeout)
	defer cancel()
	changes, err := s.opts.Policy.DryRun(ctx, files)
	if err != nil {
		return policyError(err, "dry-run")
	}
	out := DryRunResult{Processes: changes}
	if out.Processes == nil {
		out.Processes = []ClassChange{}
	}
	for _, ch := range changes {
		if ch.Changed {
			out.Changed++
		}
	}
	return c.JSON(http.StatusOK, out)
}

// AppliedResult is the answer of POST /policy/apply and /rollback.
type AppliedResult struct {
	Revision string `json:"revision"`
}

func (s *Server) applyPolicy(c echo.Context) error {
	files, err := s.policyBody(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), policyTimeout)
	defer cancel()
	rev, err := s.opts.Policy.Apply(ctx, files)
	if err != nil {
		return policyError(err, "apply")
	}
	s.log.Info().Str("revision", rev).Int("files", len(files)).Msg("policy applied through the api")
	return c.JSON(http.StatusOK, AppliedResult{Revision: rev})
}

func (s *Server) rollbackPolicy(c echo.Context) error {
	if err := s.policyService(c); err != nil {
		return err
	}
	var rev string
	b, err := readBody(c)
	if err == nil {
		rev, err = decodeRollbackRequest(b)
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), policyTimeout)
	defer cancel()
	now, err := s.opts.Policy.Rollback(ctx, rev)
	if err != nil {
		return policyError(err, "roll back to "+rev)
	}
	s.log.Info().Str("revision", now).Str("to", rev).Msg("policy rolled back through the api")
	return c.JSON(http.StatusOK, AppliedResult{Revision: now})
}

// policyService checks that the daemon has a policy service, and that
// the request names no query parameter: the policy endpoints take none.
func (s *Server) policyService(c echo.Context) error {
	if s.opts.Policy == nil {
		return errorf(http.StatusServiceUnavailable, "policy endpoints unavailable: the daemon runs without a policy directory")
	}
	return onlyParams(c.QueryParams())
}

// policyBody checks the service and reads a policy request.
func (s *Server) policyBody(c echo.Context) (PolicyFiles, error) {
	if err := s.policyService(c); err != nil {
		return nil, err
	}
	b, err := readBody(c)
	if err != nil {
		return nil, err
	}
	return decodePolicyRequest(b)
}

// readBody reads a request body that mutation has already capped.
func readBody(c echo.Context) ([]byte, error) { return readAll(c.Request().Body) }

// policyError maps a service error to the API's: the policy's own
// problems are 422 with their diagnostics, an unknown revision 404.
func policyError(err error, what string) error {
	var pe *policy.Error
	switch {
	case errors.As(err, &pe):
		he := errorf(http.StatusUnprocessableEntity, "policy %s refused: %s; the policy in force is unchanged", what, policyProblems(pe))
		for _, d := range pe.Diagnostics {
			he.details = append(he.details, d.String())
		}
		return he
	case errors.Is(err, ErrUnknownRevision):
		return errorf(http.StatusNotFound, "%v: GET %s/policy/history lists the revisions kept", err, APIPrefix)
	case errors.Is(err, ErrPolicyReadOnly):
		return errorf(http.StatusConflict, "policy %s refused: %v", what, err)
	case errors.Is(err, context.DeadlineExceeded):
		return errorf(http.StatusGatewayTimeout, "policy %s took longer than %s", what, policyTimeout)
	}
	return err
}

// policyProblems says what is wrong with a refused policy in a line: its
// one problem, or how many and the first (details lists each).
func policyProblems(pe *policy.Error) string {
	switch n := len(pe.Diagnostics); n {
	case 0:
		return firstLine(pe.Error())
	case 1:
		return pe.Diagnostics[0].String()
	default:
		return fmt.Sprintf("%d problems, the first %s (details lists them all)", n, pe.Diagnostics[0].String())
	}
}

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}
