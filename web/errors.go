package web

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/rs/zerolog"
)

// apiError is the body of every error response.
type apiError struct {
	Error   string   `json:"error"`
	Details []string `json:"details,omitempty"`
}

// httpError is an error with its status code and details.
type httpError struct {
	code    int
	msg     string
	details []string
}

func (e *httpError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) *httpError {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

// handleError writes any handler error as the API's error body: our own
// errors with their code, echo's (no such route, wrong method) with
// theirs, anything else as a 500 whose cause goes to the log only.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *httpError
	var ee *echo.HTTPError
	body := apiError{}
	code := http.StatusInternalServerError
	switch {
	case errors.As(err, &he):
		code, body.Error, body.Details = he.code, he.msg, he.details
	case errors.As(err, &ee):
		code = ee.Code
		switch code {
		case http.StatusNotFound:
			body.Error = fmt.Sprintf("no such endpoint: %s %s (the API is described at /api/v1/openapi.yaml)", c.Request().Method, c.Request().URL.Path)
		case http.StatusMethodNotAllowed:
			body.Error = fmt.Sprintf("method %s not allowed on %s", c.Request().Method, c.Request().URL.Path)
		default:
			body.Error = fmt.Sprint(ee.Message)
		}
	default:
		body.Error = "internal error; the daemon's log has the cause"
	}
	if code >= 500 {
		s.log.WithLevel(failureLevel(code)).Err(err).Str("method", c.Request().Method).Str("path", c.Request().URL.Path).Int("status", code).Msg("api request failed")
	}
	if c.Request().Method == http.MethodHead {
		err = c.NoContent(code)
	} else {
		err = c.JSON(code, body)
	}
	if err != nil {
		s.log.Debug().Err(err).Msg("write error response")
	}
}

// failureLevel is the level a failed request is logged at: an error of
// the daemon's (500) as an error; one it turned away for now (503: too
// many event streams, no policy service) as debug, since it is the
// client's to retry and any local client could fill the log with it at
// a higher level; others as warnings.
func failureLevel(code int) zerolog.Level {
	switch code {
	case http.StatusInternalServerError:
		return zerolog.ErrorLevel
	case http.StatusServiceUnavailable:
		return zerolog.DebugLevel
	}
	return zerolog.WarnLevel
}
