package fetch

import (
	"errors"
	"time"

	"github.com/gpu-arbiter/arbiter/policy"
)

// Result is how one fetch ended.
type Result string

// The results of a fetch.
const (
	// ResultActivated: a new bundle passed every check and is in force.
	ResultActivated Result = "activated"
	// ResultNotModified: the server answered 304 to the ETag in hand.
	ResultNotModified Result = "not_modified"
	// ResultUnchanged: the server sent the revision already in force.
	ResultUnchanged Result = "unchanged"
	// ResultRejected: a bundle came and was refused; the last good policy
	// stays.
	ResultRejected Result = "rejected"
	// ResultFailed: no bundle came (unreachable, timeout, an HTTP error);
	// the fetch is retried with backoff.
	ResultFailed Result = "failed"
)

// Results lists every Result, for counters that show each from the start.
func Results() []Result {
	return []Result{ResultActivated, ResultNotModified, ResultUnchanged, ResultRejected, ResultFailed}
}

// Reason is why a fetch failed or a bundle was refused.
type Reason string

// The reasons of a failed fetch or a refused bundle.
const (
	// ReasonConnection: the server could not be reached or broke the
	// connection.
	ReasonConnection Reason = "connection"
	// ReasonTimeout: no whole answer within Options.Timeout.
	ReasonTimeout Reason = "timeout"
	// ReasonHTTPStatus: the server answered neither 200 nor 304.
	ReasonHTTPStatus Reason = "http_status"
	// ReasonToken: the bearer token file could not be read.
	ReasonToken Reason = "token"
	// ReasonTooLarge: the bundle is over Options.MaxBytes.
	ReasonTooLarge Reason = "too_large"
	// ReasonBundle: not a readable OPA bundle, or over the policy size
	// limits once unpacked.
	ReasonBundle Reason = "bundle"
	// ReasonSignature: a key is configured and the bundle's signature is
	// missing or does not verify.
	ReasonSignature Reason = "signature"
	// ReasonPolicy: the policy does not parse, compile or pass its schema
	// checks.
	ReasonPolicy Reason = "policy"
	// ReasonTests: the bundle's own Rego tests fail.
	ReasonTests Reason = "tests"
)

// Reasons lists every Reason.
func Reasons() []Reason {
	return []Reason{ReasonConnection, ReasonTimeout, ReasonHTTPStatus, ReasonToken, ReasonTooLarge,
		ReasonBundle, ReasonSignature, ReasonPolicy, ReasonTests}
}

// reasonOf is why a policy error refused a bundle.
func reasonOf(err error) Reason {
	var pe *policy.Error
	if !errors.As(err, &pe) {
		return ReasonPolicy
	}
	for _, d := range pe.Diagnostics {
		switch d.Code {
		case policy.CodeSignature:
			return ReasonSignature
		case policy.CodeBundle:
			return ReasonBundle
		case policy.CodeTest:
			return ReasonTests
		}
	}
	return ReasonPolicy
}

// Event is one fetch, or the restore of a saved bundle at start.
type Event struct {
	Result Result
	// Reason is why a fetch failed or a bundle was refused.
	Reason Reason
	// Err says what went wrong; a refused policy's error is a
	// *policy.Error whose diagnostics carry file:row:col. With
	// ResultActivated it is a failure to save the bundle for the next run.
	Err error
	// Revision is the revision of the bundle fetched, when one came and
	// could be read; ETag the server's ETag for it.
	Revision, ETag string
	// Signature is what is known of the bundle's signature.
	Signature policy.Signature
	// Saved: the bundle came from Options.SaveFile, not from the server.
	Saved bool
	// Policy is the policy activated (ResultActivated).
	Policy *policy.Policy
	// InForce is the revision of the policy in force after this event.
	InForce string
	// Failures counts the failed fetches in a row, this one included.
	Failures int
	// Next is the wait until the next fetch.
	Next time.Duration
}

// Origin says where the policy in force came from.
type Origin string

// The origins of the policy in force.
const (
	// OriginBundle: a bundle fetched from the server by this run.
	OriginBundle Origin = "bundle"
	// OriginSaved: the last good bundle, saved by an earlier run.
	OriginSaved Origin = "saved"
	// OriginFallback: no bundle has passed yet; the caller's fallback.
	OriginFallback Origin = "fallback"
)

// Status is the bundle server's side of the policy in force.
type Status struct {
	// URL is the bundle URL, with any password it holds redacted.
	URL    string `json:"url"`
	Origin Origin `json:"origin"`
	// Revision, ETag and Signature are those of the bundle in force
	// (empty on the fallback); ActivatedAt is when it was swapped in.
	Revision    string           `json:"revision,omitempty"`
	ETag        string           `json:"etag,omitempty"`
	Signature   policy.Signature `json:"signature,omitempty"`
	ActivatedAt time.Time        `json:"activated_at,omitzero"`
	// SignatureRequired: a key is configured, and every bundle must be
	// signed with it.
	SignatureRequired bool `json:"signature_required"`
	// LastFetchAt and LastResult are the latest fetch's; LastSuccessAt is
	// the latest that the server answered (a bundle, refused or not, or
	// 304); LastFetchError why the latest fetch failed, while it does.
	LastFetchAt    time.Time `json:"last_fetch_at,omitzero"`
	LastResult     Result    `json:"last_result,omitempty"`
	LastSuccessAt  time.Time `json:"last_success_at,omitzero"`
	LastFetchError string    `json:"last_fetch_error,omitempty"`
	// LastError is why the latest bundle was refused, until one is
	// activated or the server serves the revision in force again.
	LastError         string    `json:"last_error,omitempty"`
	LastErrorAt       time.Time `json:"last_error_at,omitzero"`
	LastErrorReason   Reason    `json:"last_error_reason,omitempty"`
	LastErrorRevision string    `json:"last_error_revision,omitempty"`
	// LastErrorDiagnostics are the refused policy's problems, each at its
	// file:row:col where one is known.
	LastErrorDiagnostics []policy.Diagnostic `json:"last_error_diagnostics,omitempty"`
	// ConsecutiveFailures counts the failed fetches since the last answer.
	ConsecutiveFailures int       `json:"consecutive_failures"`
	NextFetchAt         time.Time `json:"next_fetch_at,omitzero"`
	// Activations and Rejections count bundles swapped in and refused
	// since start (a saved bundle restored at start included).
	Activations int `json:"activations"`
	Rejections  int `json:"rejections"`
	// Fetches counts fetches by result; Failures counts failed fetches and
	// refused bundles by reason.
	Fetches  map[Result]uint64 `json:"fetches"`
	Failures map[Reason]uint64 `json:"failures"`
}

// clearError forgets the last refused bundle: one passed, or the server
// serves the revision in force again.
func (s *Status) clearError() {
	s.LastError, s.LastErrorAt, s.LastErrorReason, s.LastErrorRevision, s.LastErrorDiagnostics = "", time.Time{}, "", "", nil
}

// clone is a copy of s that shares no map with it.
func (s *Status) clone() Status {
	c := *s
	c.Fetches = make(map[Result]uint64, len(s.Fetches))
	for k, v := range s.Fetches {
		c.Fetches[k] = v
	}
	c.Failures = make(map[Reason]uint64, len(s.Failures))
	for k, v := range s.Failures {
		c.Failures[k] = v
	}
	return c
}
