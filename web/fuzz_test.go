package web

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// checkDecodeError requires a decoder's error to be a 4xx with a message.
func checkDecodeError(t *testing.T, err error) {
	t.Helper()
	var he *httpError
	if !errors.As(err, &he) || he.code < 400 || he.code >= 500 || he.msg == "" {
		t.Fatalf("decoder error %v is not a 4xx with a message", err)
	}
}

// FuzzPolicyRequest: the policy request decoder never panics, refuses
// with a 4xx, and what it accepts is a set of safe file names.
func FuzzPolicyRequest(f *testing.F) {
	for _, s := range []string{`{"files":{"a.rego":"package a"}}`, `{"files":{"x/data.json":"{}"}}`, `{"files":{}}`,
		`{"files":{"../a.rego":""}}`, `{"files":null}`, `{"files":{"a.rego":1}}`, `{}`, `[]`, `{"files":{"a.rego":"x"}} x`, "\x00", `{"files":{"a.rego":"\u0000"}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		files, err := decodePolicyRequest(b)
		if err != nil {
			checkDecodeError(t, err)
			return
		}
		if len(files) == 0 || len(files) > MaxPolicyFiles {
			t.Fatalf("accepted %d files", len(files))
		}
		for name := range files {
			if strings.Contains(name, "..") && strings.Contains(name, "/") || strings.HasPrefix(name, "/") || strings.HasPrefix(name, ".") {
				t.Fatalf("accepted file name %q", name)
			}
		}
	})
}

// FuzzRollbackRequest: the rollback decoder never panics and refuses
// with a 4xx.
func FuzzRollbackRequest(f *testing.F) {
	for _, s := range []string{`{"revision":"abc"}`, `{"revision":""}`, `{"revision":1}`, `{"rev":"x"}`, `{}`, `null`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rev, err := decodeRollbackRequest(b)
		if err != nil {
			checkDecodeError(t, err)
			return
		}
		if rev == "" || len(rev) > 256 {
			t.Fatalf("accepted revision %q", rev)
		}
		var back RollbackRequest
		if json.Unmarshal(b, &back) != nil || back.Revision != rev {
			t.Fatalf("decoded %q from %q", rev, b)
		}
	})
}

// FuzzQuery: every GET endpoint's query and path decoding answers 200 or
// a 4xx with a JSON error, never a 5xx, for any query string.
func FuzzQuery(f *testing.F) {
	srv := newFixture(f, 5, Limits{})
	for _, s := range []string{"processes?class=a&state=running", "processes/1000", "processes/-1", "processes/99999999999",
		"decisions?since=5&limit=2", "preemptions?limit=x", "status?x=1", "classes", "gpus", "processes?state=%00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse("/api/v1/" + s)
		if err != nil || u.Path == "/api/v1/events" || strings.Contains(u.Path, "/events") {
			return // not a request a client can send; the stream never ends
		}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL = u
		w := httptest.NewRecorder()
		srv.s.Handler().ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("GET %s: %d %s", u, w.Code, w.Body)
		}
		if w.Code >= 400 {
			var e apiError
			if json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Error == "" {
				t.Fatalf("GET %s: %d without a JSON error: %s", u, w.Code, w.Body)
			}
		}
	})
}
