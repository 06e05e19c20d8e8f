package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/fetch"
	"github.com/gpu-arbiter/arbiter/web"
)

// observeOnlyPolicy is in force while the daemon waits for its first good
// bundle: every process observed, none preempted, so that nothing is
// enforced under a policy that did not pass its checks. (The embedded
// default suspends best-effort work: it is a policy too, and not the one
// the fleet's operators chose.)
const observeOnlyPolicy = `package arbiter

default_decision := {"class": "unclassified", "preemption": {"mode": "observe"}, "reason": "no good policy bundle yet: observed only"}

classify := default_decision
`

// observeOnlyRevision names the observe-only policy in the API and in
// arbiter_policy_info.
const observeOnlyRevision = "observe-only"

// openBundlePolicy starts on the last good bundle saved by an earlier run
// or, failing that, the observe-only policy; fetches the bundle once, and
// polls the server from then on. Only a bad setting (the key, the URL) is
// an error: a server that cannot be reached or a bundle refused at start
// are logged, and retried.
func openBundlePolicy(ctx context.Context, cfg config.Config, log zerolog.Logger) (*livePolicy, error) {
	lp := &livePolicy{log: log, started: time.Now()}
	var verify *bundle.VerificationConfig
	if cfg.BundlePublicKey != "" {
		v, err := fetch.LoadKey(fetch.KeyOptions{File: cfg.BundlePublicKey, Algorithm: cfg.BundleKeyAlg, KeyID: cfg.BundleKeyID, Scope: cfg.BundleScope})
		if err != nil {
			return nil, fmt.Errorf("--bundle-public-key: %w", err)
		}
		verify = v
	}
	fallback, err := observeOnly(ctx)
	if err != nil {
		return nil, err
	}
	l := log.With().Str("bundle_url", redactURL(cfg.BundleURL)).Logger()
	if verify == nil {
		l.Warn().Msg("no --bundle-public-key: bundle signatures are not checked, so whoever can serve the bundle URL sets this node's policy")
	}
	if cfg.BundleTokenFile != "" && strings.HasPrefix(cfg.BundleURL, "http://") {
		l.Warn().Msg("--bundle-token-file with an http:// URL: the token crosses the network in clear; use https")
	}
	lp.bundles, err = fetch.New(ctx, fetch.Options{URL: cfg.BundleURL, Verification: verify, TokenFile: cfg.BundleTokenFile,
		Poll: cfg.BundlePoll, Timeout: cfg.BundleTimeout, MaxBytes: cfg.BundleMaxBytes, SaveFile: bundleSaveFile(cfg),
		Fallback: fallback, OnEvent: func(ev fetch.Event) { lp.onBundle(l, ev) }, UserAgent: "arbiter/" + version})
	if err != nil {
		return nil, err
	}
	if st := lp.bundles.Status(); st.Origin == fetch.OriginFallback {
		l.Warn().Str("revision", observeOnlyRevision).Msg("no good policy bundle yet: every process is observed and none preempted until one passes its checks")
	}
	return lp, nil
}

// observeOnly loads the observe-only policy.
func observeOnly(ctx context.Context) (*policy.Policy, error) {
	src, err := policy.ReadFS(fstest.MapFS{"observe-only.rego": {Data: []byte(observeOnlyPolicy)}}, observeOnlyRevision, nil)
	if err != nil {
		return nil, fmt.Errorf("the observe-only policy: %w", err)
	}
	src.Revision = observeOnlyRevision
	return policy.New(ctx, src, nil)
}

// bundleSaveFile is where the last good bundle of the URL is kept for
// the next start: in the state directory, named for the URL, so that a
// node moved to another URL never starts on the old one's bundle.
func bundleSaveFile(cfg config.Config) string {
	sum := sha256.Sum256([]byte(cfg.BundleURL))
	return filepath.Join(cfg.StateDir, "bundles", fmt.Sprintf("%x.tar.gz", sum[:8]))
}

// onBundle logs a fetch and reclassifies after a swap. The lines name the
// URL, the bundle's revision and ETag, and for a refused bundle its
// problems with file:row:col.
func (lp *livePolicy) onBundle(l zerolog.Logger, ev fetch.Event) {
	at := func(e *zerolog.Event) *zerolog.Event {
		if ev.Revision != "" {
			e = e.Str("revision", ev.Revision)
		}
		if ev.ETag != "" {
			e = e.Str("etag", ev.ETag)
		}
		return e
	}
	switch ev.Result {
	case fetch.ResultActivated:
		if ev.Saved {
			at(l.Info()).Str("signature", string(ev.Signature)).Msg("starting on the policy bundle saved by the last run, checked again, until the bundle server answers")
		} else {
			at(l.Info()).Str("signature", string(ev.Signature)).Msg("policy bundle activated: reclassifying every process")
		}
		if ev.Signature == policy.SignatureUnchecked {
			at(l.Warn()).Msg("the policy bundle is signed, but its signature was not checked: no --bundle-public-key is configured")
		}
		if ev.Err != nil {
			l.Warn().Err(ev.Err).Msg("the policy bundle is in force but could not be saved for the next start")
		}
		lp.swapped("policy bundle revision " + ev.Revision)
	case fetch.ResultRejected:
		if ev.Saved {
			at(l.Warn()).Str("reason", string(ev.Reason)).Err(ev.Err).Msg("the policy bundle saved by the last run was refused")
			return
		}
		at(l.Error()).Str("reason", string(ev.Reason)).Err(ev.Err).Str("in_force", ev.InForce).
			Msg("policy bundle rejected: the last good policy stays in force")
	case fetch.ResultFailed:
		l.Warn().Str("reason", string(ev.Reason)).Err(ev.Err).Int("failures", ev.Failures).Dur("retry_in", ev.Next).
			Str("in_force", ev.InForce).Msg("policy bundle fetch failed: the last good policy stays in force; retrying")
	default:
		at(l.Debug()).Str("result", string(ev.Result)).Msg("policy bundle unchanged")
	}
}

// bundleStatus is the API's view of the bundle server's side; every
// result and reason is listed, zero or not, so that the counters exist
// from the start.
func bundleStatus(st fetch.Status) *web.BundleStatus {
	out := &web.BundleStatus{URL: st.URL, Origin: string(st.Origin), Revision: st.Revision, ETag: st.ETag, Signature: string(st.Signature),
		ActivatedAt: st.ActivatedAt, SignatureRequired: st.SignatureRequired, LastFetchAt: st.LastFetchAt, LastResult: string(st.LastResult),
		LastSuccessAt: st.LastSuccessAt, LastFetchError: st.LastFetchError, LastErrorReason: string(st.LastErrorReason),
		LastErrorRevision: st.LastErrorRevision, ConsecutiveFailures: st.ConsecutiveFailures, NextFetchAt: st.NextFetchAt,
		Fetches: map[string]uint64{}, Failures: map[string]uint64{}}
	for _, r := range fetch.Results() {
		out.Fetches[string(r)] = st.Fetches[r]
	}
	for _, r := range fetch.Reasons() {
		out.Failures[string(r)] = st.Failures[r]
	}
	return out
}

// redactURL hides a password a URL carries, for the logs.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
