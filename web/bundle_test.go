package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/rego"
)

// bundlePolicy is the policy service of a daemon that polls a bundle
// server: its status carries the bundle's side, and it refuses changes.
type bundlePolicy struct {
	*dirPolicy
	bundle BundleStatus
}

func (b *bundlePolicy) Status() PolicyStatus {
	st := b.dirPolicy.Status()
	st.Bundle = &b.bundle
	return st
}

func (b *bundlePolicy) Apply(context.Context, PolicyFiles) (string, error) {
	return "", fmt.Errorf("the daemon polls https://bundles.example.com/a.tar.gz for its policy: publish a new bundle there: %w", ErrPolicyReadOnly)
}

// TestBundleStatusAndMetrics: with a bundle server, GET /policy carries
// its side, /metrics exports its counters with bounded labels, and a
// policy change through the API is refused with 409 and the reason.
func TestBundleStatusAndMetrics(t *testing.T) {
	f := newFixture(t, 1, Limits{})
	success := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	bp := &bundlePolicy{dirPolicy: f.pol, bundle: BundleStatus{URL: "https://bundles.example.com/a.tar.gz", Origin: "bundle",
		Revision: "2026-03-01.1", Signature: "verified", SignatureRequired: true, LastResult: "rejected", LastSuccessAt: success,
		LastErrorReason: "tests", ConsecutiveFailures: 2,
		Fetches:  map[string]uint64{"activated": 1, "not_modified": 7, "unchanged": 0, "rejected": 1, "failed": 2},
		Failures: map[string]uint64{"tests": 1, "timeout": 2, "signature": 0}}}
	tok := filepath.Join(t.TempDir(), "tok")
	s, err := New(Options{Snapshots: f.eng, Policy: bp, TokenFile: tok, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	token, _ := os.ReadFile(tok)
	g := &fixture{s: s, eng: f.eng, pol: f.pol, token: string(bytes.TrimSpace(token))}
	s.SetReady(true)

	w := g.do("GET", "/api/v1/policy", nil)
	var st PolicyStatus
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != 200 {
		t.Fatalf("GET /policy: %d %v %s", w.Code, err, w.Body)
	}
	if st.Bundle == nil || st.Bundle.Revision != "2026-03-01.1" || st.Bundle.Fetches["not_modified"] != 7 || !st.Bundle.LastSuccessAt.Equal(success) {
		t.Fatalf("bundle status %+v", st.Bundle)
	}

	metrics := g.do("GET", "/metrics", nil).Body.String()
	for _, want := range []string{
		`arbiter_policy_bundle_info{origin="bundle",signature="verified"} 1`,
		`arbiter_policy_bundle_fetches_total{result="not_modified"} 7`,
		`arbiter_policy_bundle_fetches_total{result="unchanged"} 0`,
		`arbiter_policy_bundle_failures_total{reason="timeout"} 2`,
		`arbiter_policy_bundle_failures_total{reason="tests"} 1`,
		`arbiter_policy_bundle_consecutive_failures 2`,
		fmt.Sprintf("arbiter_policy_bundle_last_success_timestamp_seconds %g", float64(success.Unix())),
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(f.do("GET", "/metrics", nil).Body.String(), "arbiter_policy_bundle_") {
		t.Error("a daemon without a bundle server exports bundle metrics")
	}

	w = g.do("POST", "/api/v1/policy/apply", policyBody(t, readFS(t, rego.Default())))
	if w.Code != 409 || !strings.Contains(w.Body.String(), "publish a new bundle there") {
		t.Fatalf("apply with a bundle server: %d %s", w.Code, w.Body)
	}
}
