package web

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
)

// contentSecurityPolicy allows the same-origin console and nothing else:
// no inline script or style, no framing, no plugins, no foreign fetches.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"

// secure sets the security headers on every response, errors included.
func secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), usb=()")
		h.Set("Cache-Control", "no-store")
		if r.TLS != nil {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		next.ServeHTTP(w, r)
	})
}

// crossOrigin refuses state-changing requests a browser sends from another
// origin (Sec-Fetch-Site, Origin): with the token in a header only, a
// forged request cannot authenticate anyway; this refuses it earlier.
func crossOrigin(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusForbidden, "cross-origin request refused: the API accepts changes only from its own origin or from non-browser clients", nil)
	}))
	return cop.Handler(next)
}

// localHost answers, on a plain HTTP listener on a loopback address,
// only requests whose Host is localhost or an IP address. Reads need no
// token there (reaching the address is the permission), and a page on
// another site could reach it by DNS rebinding: pointing a name of its
// own at 127.0.0.1, its scripts would read the API under that name.
func localHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
		if host != "localhost" && net.ParseIP(host) == nil {
			writeError(w, http.StatusMisdirectedRequest, fmt.Sprintf("Host %q: the API on a loopback address answers to localhost or an IP address only", r.Host), nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// writeError writes the API's error body outside echo.
func writeError(w http.ResponseWriter, code int, msg string, details []string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(apiError{Error: msg, Details: details})
}

// mutation guards a POST endpoint: bearer token, rate limit, JSON content
// type, body size. Order matters: a request without the token is refused
// before it can use up the rate limit's budget (guessing a 256-bit token
// is hopeless at any rate), and nothing is read before both pass.
func (s *Server) mutation(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if !s.authorized(r.Header.Get("Authorization")) {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="arbiter"`)
			return errorf(http.StatusUnauthorized, "missing or wrong API token: send \"Authorization: Bearer <token>\" with the token from %s", s.opts.TokenFile)
		}
		if !s.limiter.Allow() {
			c.Response().Header().Set("Retry-After", "1")
			return errorf(http.StatusTooManyRequests, "too many changes: at most %g a second (burst %d); retry later", s.lim.MutationsPerSecond, s.lim.MutationBurst)
		}
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			return errorf(http.StatusUnsupportedMediaType, "content type %q refused: send the body as application/json", r.Header.Get("Content-Type"))
		}
		if r.ContentLength > s.lim.MaxBodyBytes {
			return errorf(http.StatusRequestEntityTooLarge, "request body of %d bytes is over the limit of %d bytes", r.ContentLength, s.lim.MaxBodyBytes)
		}
		r.Body = http.MaxBytesReader(c.Response(), r.Body, s.lim.MaxBodyBytes)
		return next(c)
	}
}

// authorized compares the bearer token in constant time.
func (s *Server) authorized(header string) bool {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), s.token) == 1
}

// readAll reads a capped request body, turning the cap into a 413.
func readAll(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(r)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, errorf(http.StatusRequestEntityTooLarge, "request body is over the limit of %d bytes", tooBig.Limit)
	}
	if err != nil {
		return nil, errorf(http.StatusBadRequest, "read request body: %v", err)
	}
	return b, nil
}

// decodeBody reads exactly one JSON value into v, refusing unknown fields
// and trailing data, and turns every failure into a 400 that says what
// was wrong and where. Every request decoder goes through it.
func decodeBody(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return errorf(http.StatusBadRequest, "empty request body: send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errorf(http.StatusBadRequest, "malformed JSON body: %s", jsonProblem(b, err))
	}
	if dec.More() {
		return errorf(http.StatusBadRequest, "malformed JSON body: data after the first JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errorf(http.StatusBadRequest, "malformed JSON body: data after the first JSON value")
	}
	return nil
}

// jsonProblem says what a JSON decoding error means, with a position.
func jsonProblem(b []byte, err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("%v at byte %d", syn, syn.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q must be %s, not %s (byte %d)", typ.Field, typ.Type, typ.Value, typ.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of input after " + strconv.Itoa(len(b)) + " bytes"
	}
	return err.Error() // "json: unknown field \"x\"" and the like
}
