package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/trace"
	"github.com/gpu-arbiter/arbiter/web"
)

const (
	svcPolicy = "package arbiter\n\nclassify := {\"class\": \"batch\", \"preemption\": {\"mode\": \"suspend\"}}\n\ndefault_decision := classify\n"
	svcTest   = "package arbiter_test\n\nimport data.arbiter\n\ntest_batch if arbiter.classify.class == \"batch\"\n"
)

// closedSource ends at once: the service's tests need an engine only for
// its (empty) snapshot.
type closedSource struct{}

func (closedSource) Read(*trace.Event) error { return trace.ErrClosed }
func (closedSource) Close() error            { return nil }

func newTestPolicyService(t *testing.T, dir string) *policyService {
	t.Helper()
	lp, err := openPolicy(context.Background(), dir, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lp.close() })
	eng, err := engine.New(closedSource{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return newPolicyService(lp, func() *engine.Engine { return eng }, procfs.New("/"), func() policy.Node { return policy.Node{} })
}

// TestPolicyService: the daemon's policy endpoints go through the same
// checks as a change on disk: a candidate that fails to compile or fails
// its own Rego tests is reported at its line and never written; a good
// one is written into the directory and reloaded; history and rollback
// restore an earlier revision's files.
func TestPolicyService(t *testing.T) {
	dir := policyDir(t, map[string]string{"p.rego": svcPolicy, "p_test.rego": svcTest})
	s := newTestPolicyService(t, dir)
	ctx := context.Background()
	start := s.Status().Revision
	if ro := s.Status().ReadOnly; ro != "" {
		t.Errorf("a policy directory is read-only through the API: %q", ro)
	}
	// The files by the paths Apply takes, and their text.
	if f := s.Status().Files; len(f) != 2 || f[0] != "p.rego" || f[1] != "p_test.rego" {
		t.Errorf("status files %q, want p.rego and p_test.rego", f)
	}
	if src, err := s.Sources(); err != nil || len(src) != 2 || string(src["p.rego"]) != svcPolicy || string(src["p_test.rego"]) != svcTest {
		t.Errorf("sources %v %v", src, err)
	}

	ds, err := s.Validate(ctx, web.PolicyFiles{"p.rego": []byte("package arbiter\n\nclassify := {\"class\": }\n")})
	if err != nil || len(ds) == 0 || ds[0].File != "p.rego" || ds[0].Row != 3 {
		t.Errorf("syntax error: %+v %v; want it at p.rego, as sent", ds, err)
	}
	failing := web.PolicyFiles{"p.rego": []byte(strings.Replace(svcPolicy, `"batch"`, `"other"`, 1)), "p_test.rego": []byte(svcTest)}
	ds, _ = s.Validate(ctx, failing)
	if len(ds) != 1 || ds[0].Code != policy.CodeTest || !strings.Contains(ds[0].Message, "test_batch") {
		t.Errorf("failing Rego test: %+v", ds)
	}
	if _, err := s.Apply(ctx, failing); err == nil {
		t.Fatal("applied a policy that fails its own tests")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "p.rego")); string(b) != svcPolicy || s.Status().Revision != start {
		t.Fatalf("a refused policy changed the directory or the policy in force")
	}
	if _, err := s.Validate(ctx, web.PolicyFiles{"../escape.rego": []byte(svcPolicy)}); err != nil {
		t.Fatal(err)
	}
	if ds, _ := s.Validate(ctx, web.PolicyFiles{"../escape.rego": []byte(svcPolicy)}); len(ds) == 0 {
		t.Error("a file name climbing out of the directory was accepted")
	}

	next := web.PolicyFiles{"p.rego": []byte(strings.Replace(svcPolicy, "suspend", "gate", 1)), "lib/extra.rego": []byte("package arbiter.extra\n\nx := 1\n")}
	rev, err := s.Apply(ctx, next)
	if err != nil || rev == start || s.Status().Revision != rev {
		t.Fatalf("apply: %q %v (status %q)", rev, err, s.Status().Revision)
	}
	if _, err := os.Stat(filepath.Join(dir, "p_test.rego")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a file the applied revision lacks is still in the directory")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "lib", "extra.rego")); !strings.Contains(string(b), "x := 1") {
		t.Error("a file in a subdirectory was not written")
	}
	h := s.History()
	if len(h) != 2 || h[0].Revision != rev || !h[0].Current || h[0].Origin != "api" || h[1].Revision != start || h[1].Current {
		t.Fatalf("history %+v", h)
	}
	back, err := s.Rollback(ctx, start)
	if err != nil || back != start {
		t.Fatalf("rollback: %q %v", back, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "p_test.rego")); string(b) != svcTest {
		t.Error("rollback did not restore the startup files")
	}
	if _, err := s.Rollback(ctx, "nope"); !errors.Is(err, web.ErrUnknownRevision) {
		t.Errorf("rollback to an unknown revision: %v", err)
	}
}

// TestPolicyServiceEmbedded: with the embedded default policy there is no
// directory to write; changes are refused with what to do; its status
// says when it was loaded and how it is evaluated.
func TestPolicyServiceEmbedded(t *testing.T) {
	before := time.Now()
	s := newTestPolicyService(t, "")
	if st := s.Status(); st.LoadedAt.Before(before) || st.LoadedAt.After(time.Now()) || st.Evaluator == "" || !strings.Contains(st.ReadOnly, "embedded default policy") {
		t.Errorf("embedded policy loaded at %v (want between %v and now), evaluator %q", st.LoadedAt, before, st.Evaluator)
	}
	if _, err := s.Apply(context.Background(), web.PolicyFiles{"p.rego": []byte(svcPolicy), "p_test.rego": []byte(svcTest)}); !errors.Is(err, errEmbedded) {
		t.Errorf("apply on the embedded policy: %v", err)
	}
	if h := s.History(); len(h) != 1 || s.Status().Revision == "" || len(h[0].Files) == 0 || !slices.Equal(h[0].Files, s.Status().Files) {
		t.Errorf("history %+v status %+v: want the startup revision with the files status lists", h, s.Status())
	}
	if _, err := s.Rollback(context.Background(), s.Status().Revision); !errors.Is(err, errEmbedded) {
		t.Errorf("rollback on the embedded policy: %v, want the embedded policy's refusal", err)
	}
	if src, err := s.Sources(); src != nil || err != nil {
		t.Errorf("sources of the embedded policy: %v %v", src, err)
	}
}

// TestPolicyServiceRecordsFileChanges: a policy changed on disk and
// reloaded (SIGHUP, or the watcher seeing the change) is in the history
// as current, with origin file, and the startup revision stays one
// rollback away.
func TestPolicyServiceRecordsFileChanges(t *testing.T) {
	dir := policyDir(t, map[string]string{"p.rego": svcPolicy, "p_test.rego": svcTest})
	s := newTestPolicyService(t, dir)
	ctx := context.Background()
	start := s.Status().Revision
	edited := strings.Replace(svcPolicy, "suspend", "gate", 1)
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	s.lp.reload(ctx) // as SIGHUP does
	rev := s.Status().Revision
	if rev == start {
		t.Fatal("the edited policy was not loaded")
	}
	var h []web.PolicyRevision
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// The watcher may see the write too: one entry either way.
		if h = s.History(); len(h) == 2 || time.Now().After(end) {
			break
		}
	}
	if len(h) != 2 || h[0].Revision != rev || !h[0].Current || h[0].Origin != "file" || h[1].Revision != start || h[1].Current {
		t.Fatalf("history %+v", h)
	}
	if back, err := s.Rollback(ctx, start); err != nil || back != start {
		t.Fatalf("rollback to the startup revision: %q %v", back, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "p.rego")); string(b) != svcPolicy {
		t.Error("rollback did not restore the startup file")
	}
	if back, err := s.Rollback(ctx, rev); err != nil || back != rev {
		t.Fatalf("rollback to the revision changed on disk: %q %v", back, err)
	}
}
