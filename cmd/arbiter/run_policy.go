package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/fetch"
	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/rego"
)

// livePolicy is the daemon's policy: a watched directory, hot-reloaded
// only when the new policy loads, checks and passes its own tests; a
// bundle server, polled, whose bundles pass the same before they apply
// (run_bundle.go); or the embedded default.
type livePolicy struct {
	dir      string // "" for the embedded default and a bundle server
	watcher  *policy.Watcher
	bundles  *fetch.Poller // --bundle-url
	fixed    *policy.Policy
	log      zerolog.Logger
	started  time.Time
	mu       sync.Mutex
	reloaded []func(why string)
}

// openPolicy loads the policy the daemon starts with; an error names every
// problem with its file:row:col, and the daemon does not start.
func openPolicy(ctx context.Context, dir string, log zerolog.Logger) (*livePolicy, error) {
	lp := &livePolicy{dir: dir, log: log, started: time.Now()}
	if dir == "" {
		p, err := policy.LoadFS(ctx, rego.Default(), ".", nil)
		if err != nil {
			return nil, err
		}
		lp.fixed = p
		return lp, nil
	}
	w, err := policy.Watch(ctx, dir, &policy.WatchOptions{OnReload: lp.onChange})
	if err != nil {
		return nil, err
	}
	lp.watcher = w
	return lp, nil
}

// onChange is the watcher's callback after every reload attempt.
func (lp *livePolicy) onChange(p *policy.Policy, err error) {
	if err != nil {
		lp.log.Error().Err(err).Str("policy", lp.dir).Msg("policy change rejected: the last good policy stays in force")
		return
	}
	lp.log.Info().Str("revision", p.Revision()).Msg("policy reloaded: reclassifying every process")
	lp.swapped("policy reload to revision " + p.Revision())
}

// swapped runs what was registered for a policy swapped in.
func (lp *livePolicy) swapped(why string) {
	lp.mu.Lock()
	fns := lp.reloaded
	lp.mu.Unlock()
	for _, fn := range fns {
		fn(why)
	}
}

// onReload registers what to do after a policy was swapped in.
func (lp *livePolicy) onReload(fn func(why string)) {
	lp.mu.Lock()
	lp.reloaded = append(lp.reloaded, fn)
	lp.mu.Unlock()
}

// current is the policy in force.
func (lp *livePolicy) current() *policy.Policy {
	switch {
	case lp.watcher != nil:
		return lp.watcher.Policy()
	case lp.bundles != nil:
		return lp.bundles.Policy()
	}
	return lp.fixed
}

// reload re-reads the directory, or polls the bundle server, now
// (SIGHUP).
func (lp *livePolicy) reload(ctx context.Context) {
	if lp.bundles != nil {
		lp.log.Info().Str("bundle_url", lp.bundles.Status().URL).Msg("SIGHUP: polling the bundle server now")
		lp.bundles.Poll(ctx)
		return
	}
	if lp.watcher == nil {
		lp.log.Info().Msg("SIGHUP: the embedded default policy is in force; nothing to reload")
		return
	}
	if err := lp.watcher.Reload(ctx); err != nil {
		lp.log.Error().Err(err).Msg("SIGHUP reload rejected: the last good policy stays in force")
	}
}

func (lp *livePolicy) describe() string {
	switch {
	case lp.bundles != nil:
		st := lp.bundles.Status()
		return fmt.Sprintf("bundle server %s, revision %s (%s)", st.URL, lp.current().Revision(), st.Origin)
	case lp.dir == "":
		return "embedded default, revision " + lp.fixed.Revision()
	}
	return lp.dir + ", revision " + lp.current().Revision()
}

func (lp *livePolicy) close() error {
	switch {
	case lp.watcher != nil:
		return lp.watcher.Close()
	case lp.bundles != nil:
		return lp.bundles.Close()
	}
	return nil
}

// classifier classifies live processes: their input is read from /proc.
// pod, when set, names a process's pod from the UID in its cgroup path.
func (lp *livePolicy) classifier(node func() policy.Node, proc *procfs.FS, pod func(uid string) (input.Pod, bool)) engine.Classifier {
	opts := &input.Options{Pod: pod}
	return &policyClassifier{current: lp.current, node: node, timeout: policy.DefaultEvalTimeout,
		describe: func(p engine.ProcessInfo) (input.Process, error) {
			return input.ReadProcess(proc, int(p.Key.PID), opts)
		}}
}

// victims is the policy's control-loop entry point. It follows the policy
// in force: one without a victims rule, at start or after a reload, leaves
// the choice to the engine's default.
func (lp *livePolicy) victims(node func() policy.Node) engine.VictimChooser {
	return &policyVictims{current: lp.current, node: node, timeout: 50 * time.Millisecond}
}
