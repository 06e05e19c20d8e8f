package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing/fstest"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/fetch"
	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/web"
)

// policyService serves the API's policy endpoints for the daemon. Every
// change takes the way a change on disk takes: the candidate is loaded,
// checked and its Rego tests run first; then its files are written
// atomically into the policy directory and the watcher reloads them, with
// the same checks again. A candidate that fails is never applied, and the
// previous files are put back if the reload refuses them.
type policyService struct {
	lp   *livePolicy
	eng  func() *engine.Engine
	proc *procfs.FS
	node func() policy.Node
	mu   sync.Mutex
	hist []revision
	// applying is set while Apply or Rollback reloads the directory,
	// which records the revision itself, with its origin.
	applying atomic.Bool
}

// revision is one applied policy and its files, for rollback.
type revision struct {
	web.PolicyRevision
	files web.PolicyFiles
}

var _ web.PolicyService = (*policyService)(nil)

// errEmbedded refuses changes when the daemon runs the embedded policy.
var errEmbedded = fmt.Errorf("%s: %w", embeddedReadOnly, web.ErrPolicyReadOnly)

// embeddedReadOnly is why the embedded default policy is not changed
// through the API, and what to do instead.
const embeddedReadOnly = "the daemon runs the embedded default policy: start it with --policy DIR (or policy: in the config file) to manage policies through the API"

// errBundle refuses changes when the policy comes from a bundle server.
func errBundle(url string) error {
	return fmt.Errorf("%s: %w", bundleReadOnly(url), web.ErrPolicyReadOnly)
}

// bundleReadOnly is why a policy from a bundle server is not changed
// through the API, and what to do instead.
func bundleReadOnly(url string) string {
	return fmt.Sprintf("the daemon takes its policy from the bundle server %s (--bundle-url): publish a new bundle there "+
		"(POST /policy/validate and /policy/dry-run still check one)", url)
}

func newPolicyService(lp *livePolicy, eng func() *engine.Engine, proc *procfs.FS, node func() policy.Node) *policyService {
	s := &policyService{lp: lp, eng: eng, proc: proc, node: node}
	files, _ := s.readDir()
	names := sortedNames(files)
	if lp.dir == "" || lp.bundles != nil {
		names = lp.current().Source().Files() // the embedded default's, a bundle's: not the service's to keep
	}
	s.hist = append(s.hist, revision{PolicyRevision: web.PolicyRevision{Revision: lp.current().Revision(), AppliedAt: time.Now().UTC(),
		Files: names, Origin: "startup"}, files: files})
	switch {
	case lp.bundles != nil:
		lp.onReload(func(string) { s.recordBundle() })
	case lp.watcher != nil:
		lp.onReload(func(string) { s.recordFile() })
	}
	return s
}

// recordFile adds a revision the watcher loaded from the directory (a
// change on disk, SIGHUP) to the history, with its files, for rollback;
// one Apply or Rollback reloads records itself.
func (s *policyService) recordFile() {
	if s.applying.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rev := s.lp.current().Revision()
	if n := len(s.hist); n > 0 && s.hist[n-1].Revision == rev {
		return
	}
	files, err := s.readDir()
	if err != nil {
		files = nil // listed, not offered for rollback
	}
	s.hist = append(s.hist, revision{PolicyRevision: web.PolicyRevision{Revision: rev, AppliedAt: time.Now().UTC(),
		Files: sortedNames(files), Origin: "file"}, files: files})
}

// recordBundle adds the bundle just swapped in to the history; its files
// are the server's to keep, not the service's.
func (s *policyService) recordBundle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hist = append(s.hist, revision{PolicyRevision: web.PolicyRevision{Revision: s.lp.current().Revision(), AppliedAt: time.Now().UTC(),
		Files: s.lp.current().Source().Files(), Origin: "bundle"}})
}

// Status implements web.PolicyService.
func (s *policyService) Status() web.PolicyStatus {
	pol := s.lp.current()
	st := web.PolicyStatus{Revision: pol.Revision(), Files: pol.Source().Files()}
	if s.lp.dir != "" {
		// By the relative paths Apply takes, as Sources gives them.
		for i, f := range st.Files {
			if rel, err := filepath.Rel(s.lp.dir, f); err == nil && filepath.IsLocal(rel) {
				st.Files[i] = filepath.ToSlash(rel)
			}
		}
		slices.Sort(st.Files)
	}
	if s.lp.bundles != nil {
		return s.bundleStatus(st, pol)
	}
	if s.lp.watcher == nil {
		// The embedded default: loaded once, at start, never reloaded.
		ev, _ := pol.Evaluator()
		st.LoadedAt, st.Evaluator, st.ReadOnly = s.lp.started, string(ev), embeddedReadOnly
		return st
	}
	ws := s.lp.watcher.Status()
	st.LoadedAt, st.LastError, st.LastErrorAt, st.Reloads, st.Rejected, st.Evaluator =
		ws.LoadedAt, ws.LastError, ws.LastErrorAt, ws.Reloads, ws.Rejected, string(ws.Evaluator)
	if ws.LastError != "" {
		st.Diagnostics = []policy.Diagnostic{{Code: policy.CodeLoad, Message: ws.LastError}}
	}
	return st
}

// Sources implements web.PolicySources: the policy directory's files, by
// the relative paths Apply takes; none for the embedded default and a
// bundle server, which the API does not change.
func (s *policyService) Sources() (web.PolicyFiles, error) {
	if s.lp.bundles != nil || s.lp.watcher == nil {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readDir()
}

// bundleStatus fills st from the bundle poller.
func (s *policyService) bundleStatus(st web.PolicyStatus, pol *policy.Policy) web.PolicyStatus {
	bs := s.lp.bundles.Status()
	st.LoadedAt = bs.ActivatedAt
	if bs.Origin == fetch.OriginFallback {
		st.LoadedAt = s.lp.started
	}
	st.LastError, st.LastErrorAt, st.Diagnostics, st.Reloads, st.Rejected = bs.LastError, bs.LastErrorAt, bs.LastErrorDiagnostics, bs.Activations, bs.Rejections
	ev, _ := pol.Evaluator()
	st.Evaluator = string(ev)
	st.Bundle = bundleStatus(bs)
	st.ReadOnly = bundleReadOnly(bs.URL)
	return st
}

// candidate loads, checks and tests files as the watcher does
// (policy.Check).
func (s *policyService) candidate(ctx context.Context, files web.PolicyFiles) (*policy.Policy, error) {
	if err := files.Check(); err != nil {
		return nil, &policy.Error{Source: "request", Diagnostics: []policy.Diagnostic{{Code: policy.CodeLoad, Message: err.Error()}}}
	}
	fsys := fstest.MapFS{}
	for name, b := range files {
		fsys[name] = &fstest.MapFile{Data: b, Mode: 0o644}
	}
	// Named ".": diagnostics name each file by the path it was sent as.
	src, err := policy.ReadFS(fsys, ".", nil)
	if err != nil {
		return nil, err
	}
	return policy.Check(ctx, src, nil)
}

// Validate implements web.PolicyService.
func (s *policyService) Validate(ctx context.Context, files web.PolicyFiles) ([]policy.Diagnostic, error) {
	if _, err := s.candidate(ctx, files); err != nil {
		var pe *policy.Error
		if errors.As(err, &pe) {
			return pe.Diagnostics, nil
		}
		return policy.Diagnostics(err), nil
	}
	return nil, nil
}

// DryRun implements web.PolicyService: every live process classified by
// the candidate beside what it is now.
func (s *policyService) DryRun(ctx context.Context, files web.PolicyFiles) ([]web.ClassChange, error) {
	pol, err := s.candidate(ctx, files)
	if err != nil {
		return nil, err
	}
	snap := s.eng().Snapshot()
	out := make([]web.ClassChange, 0, len(snap.Processes))
	for _, p := range snap.Processes {
		in, rerr := input.ReadProcess(s.proc, int(p.PID), nil)
		if rerr != nil {
			in = input.Process{PID: int(p.PID), Comm: p.Comm}
		}
		in.GPUs = p.GPUs
		d, cerr := pol.Classify(ctx, policy.Input{Process: in, Node: s.node()})
		plan := d.Compile()
		c := web.ClassChange{PID: p.PID, Comm: p.Comm, FromClass: p.Class, ToClass: plan.Class, FromLevel: p.Planned, ToLevel: plan.Level, Reason: d.Reason}
		if cerr != nil {
			c.Fallback = cerr.Error()
		}
		c.Changed = c.FromClass != c.ToClass || c.FromLevel != c.ToLevel
		out = append(out, c)
	}
	return out, nil
}

// Apply implements web.PolicyService.
func (s *policyService) Apply(ctx context.Context, files web.PolicyFiles) (string, error) {
	return s.apply(ctx, files, "api")
}

// Rollback implements web.PolicyService.
func (s *policyService) Rollback(ctx context.Context, rev string) (string, error) {
	s.mu.Lock()
	i := slices.IndexFunc(s.hist, func(r revision) bool { return r.Revision == rev })
	var files web.PolicyFiles
	if i >= 0 {
		files = s.hist[i].files
	}
	s.mu.Unlock()
	switch {
	case s.lp.bundles != nil:
		return "", errBundle(s.lp.bundles.Status().URL)
	case s.lp.watcher == nil:
		return "", errEmbedded
	case i < 0:
		return "", fmt.Errorf("%w: %q", web.ErrUnknownRevision, rev)
	case files == nil:
		return "", fmt.Errorf("%w: %q: its files could not be read when it was loaded, so they were not kept", web.ErrUnknownRevision, rev)
	}
	return s.apply(ctx, files, "rollback")
}

// History implements web.PolicyService.
func (s *policyService) History() []web.PolicyRevision {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.lp.current().Revision()
	out := make([]web.PolicyRevision, 0, len(s.hist))
	for i := len(s.hist) - 1; i >= 0; i-- {
		r := s.hist[i].PolicyRevision
		r.Current = r.Revision == cur && !slices.ContainsFunc(out, func(x web.PolicyRevision) bool { return x.Current })
		out = append(out, r)
	}
	return out
}

func (s *policyService) apply(ctx context.Context, files web.PolicyFiles, origin string) (string, error) {
	switch {
	case s.lp.bundles != nil:
		return "", errBundle(s.lp.bundles.Status().URL)
	case s.lp.watcher == nil:
		return "", errEmbedded
	}
	if _, err := s.candidate(ctx, files); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.readDir()
	if err != nil {
		return "", err
	}
	if err := writeDir(s.lp.dir, files, old); err != nil {
		return "", err
	}
	s.applying.Store(true)
	defer s.applying.Store(false)
	if err := s.lp.watcher.Reload(ctx); err != nil {
		// The watcher refused it: put the previous files back so that the
		// directory says what is in force.
		if rerr := writeDir(s.lp.dir, old, files); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restore the previous files: %w", rerr))
		}
		return "", err
	}
	rev := s.lp.current().Revision()
	s.hist = append(s.hist, revision{PolicyRevision: web.PolicyRevision{Revision: rev, AppliedAt: time.Now().UTC(), Files: sortedNames(files), Origin: origin}, files: files})
	return rev, nil
}

// readDir reads the policy directory's files as the loader does: .rego,
// data.json and data.yaml, in subdirectories too, hidden names skipped
// (nil for the embedded policy).
func (s *policyService) readDir() (web.PolicyFiles, error) {
	if s.lp.dir == "" {
		return nil, nil
	}
	files := web.PolicyFiles{}
	err := filepath.WalkDir(s.lp.dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n := e.Name()
		if strings.HasPrefix(n, ".") && p != s.lp.dir {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.IsDir() || !(strings.HasSuffix(n, ".rego") || n == "data.json" || n == "data.yaml") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(s.lp.dir, p)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the policy directory %s: %w", s.lp.dir, err)
	}
	return files, nil
}

// writeDir makes dir hold files: each written to a temporary file and
// renamed over its name (a reader sees the old or the new file, never a
// part), then the files of prev that files lacks removed.
func writeDir(dir string, files, prev web.PolicyFiles) error {
	for _, n := range sortedNames(files) {
		target := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return fmt.Errorf("write policy file %s: %w", n, err)
		}
		tmp, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".*")
		if err != nil {
			return fmt.Errorf("write policy file %s: %w", n, err)
		}
		_, werr := tmp.Write(files[n])
		if err := errors.Join(werr, tmp.Sync(), tmp.Chmod(0o644), tmp.Close()); err != nil {
			os.Remove(tmp.Name())
			return fmt.Errorf("write policy file %s: %w", n, err)
		}
		if err := os.Rename(tmp.Name(), target); err != nil {
			os.Remove(tmp.Name())
			return fmt.Errorf("write policy file %s: %w", n, err)
		}
	}
	for n := range prev {
		if _, keep := files[n]; !keep {
			if err := os.Remove(filepath.Join(dir, filepath.FromSlash(n))); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove policy file %s: %w", n, err)
			}
		}
	}
	return nil
}

func sortedNames(files web.PolicyFiles) []string {
	out := make([]string, 0, len(files))
	for n := range files {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
