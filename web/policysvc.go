package web

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/sched"
)

// PolicyService is what the policy endpoints need of the daemon, which
// owns the policy directory and its watcher. Every change it makes goes
// the way a change on disk goes: Apply and Rollback write the files into
// the policy directory atomically and reload through the watcher, which
// loads, checks and runs the policy's Rego tests before swapping; a
// policy that fails any of it is never applied and the one in force
// stays.
//
// Errors that are the policy's fault wrap a *policy.Error (the API
// answers 422 with its diagnostics); ErrUnknownRevision answers 404;
// anything else is the daemon's failure (500).
type PolicyService interface {
	// Status says which policy is in force and how the last reload went.
	Status() PolicyStatus
	// Validate loads, checks and tests files without applying them; no
	// diagnostics means they would be applied.
	Validate(ctx context.Context, files PolicyFiles) ([]policy.Diagnostic, error)
	// DryRun classifies the running processes with files and says, for
	// each, what would change.
	DryRun(ctx context.Context, files PolicyFiles) ([]ClassChange, error)
	// Apply replaces the policy directory's files with files and reloads;
	// it returns the new revision.
	Apply(ctx context.Context, files PolicyFiles) (string, error)
	// History lists the revisions applied since the daemon started, the
	// newest first.
	History() []PolicyRevision
	// Rollback applies an earlier revision again, the same way as Apply,
	// and returns the revision now in force.
	Rollback(ctx context.Context, revision string) (string, error)
}

// PolicySources is implemented by a PolicyService whose policy is a
// directory it can read: GET /policy then also gives the text of its
// files, by the relative paths Apply takes, which the console's editor
// starts from.
type PolicySources interface {
	// Sources returns the files of the policy in force; nil when it has
	// none to give (the embedded default, a bundle server).
	Sources() (PolicyFiles, error)
}

// ErrUnknownRevision is the error of a Rollback to a revision the
// service does not keep.
var ErrUnknownRevision = errors.New("unknown policy revision")

// ErrPolicyReadOnly is the error of an Apply or Rollback where the policy
// does not come from a directory the daemon may write: the embedded
// default, or a bundle server. The API answers 409 with the error's text,
// which says where the policy comes from and how to change it.
var ErrPolicyReadOnly = errors.New("the policy in force is not managed through the API")

// PolicyFiles are a policy's files by relative path: Rego modules
// (*.rego, tests included) and data.json / data.yaml.
type PolicyFiles map[string][]byte

// Limits of PolicyFiles.
const (
	MaxPolicyFiles    = 256
	maxPolicyPathLen  = 255
	maxPolicyPathDeep = 8
)

// Check refuses a set of files that could not be written safely into a
// policy directory: none, too many, a path that is absolute, climbs out
// with "..", is hidden, or names a file the loader would not read.
func (f PolicyFiles) Check() error {
	if len(f) == 0 {
		return errors.New("no policy files: send at least one .rego file")
	}
	if len(f) > MaxPolicyFiles {
		return fmt.Errorf("%d policy files, more than the %d allowed", len(f), MaxPolicyFiles)
	}
	for name := range f {
		if err := checkPolicyPath(name); err != nil {
			return err
		}
	}
	return nil
}

func checkPolicyPath(name string) error {
	switch {
	case name == "" || len(name) > maxPolicyPathLen:
		return fmt.Errorf("policy file name %q: want 1 to %d characters", name, maxPolicyPathLen)
	case strings.ContainsAny(name, "\\\x00") || path.IsAbs(name) || path.Clean(name) != name:
		return fmt.Errorf("policy file name %q: want a clean relative path with forward slashes", name)
	case strings.Count(name, "/") >= maxPolicyPathDeep:
		return fmt.Errorf("policy file name %q: nested deeper than %d directories", name, maxPolicyPathDeep)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." || strings.HasPrefix(part, ".") {
			return fmt.Errorf("policy file name %q: no hidden files or \"..\"", name)
		}
	}
	base := path.Base(name)
	if !strings.HasSuffix(base, ".rego") && base != "data.json" && base != "data.yaml" && base != "data.yml" {
		return fmt.Errorf("policy file name %q: the loader reads only *.rego, data.json and data.yaml", name)
	}
	return nil
}

// PolicyStatus says which policy is in force and how the last reload went.
type PolicyStatus struct {
	Revision string    `json:"revision"`
	Files    []string  `json:"files"`
	LoadedAt time.Time `json:"loaded_at"`
	// LastError is why the most recent attempt was rejected (empty when it
	// was applied); Diagnostics its problems with file:row:col.
	LastError   string              `json:"last_error,omitempty"`
	LastErrorAt time.Time           `json:"last_error_at,omitzero"`
	Diagnostics []policy.Diagnostic `json:"diagnostics,omitempty"`
	// Reloads counts policies applied, Rejected those refused, since the
	// daemon started.
	Reloads   int    `json:"reloads"`
	Rejected  int    `json:"rejected"`
	Evaluator string `json:"evaluator,omitempty"`
	// ReadOnly says why the daemon refuses policy changes through the API
	// (the embedded default policy, a bundle server) and what to do
	// instead; empty where it takes them.
	ReadOnly string `json:"read_only,omitempty"`
	// Bundle is the bundle server's side, when the daemon polls one
	// (--bundle-url); nil otherwise.
	Bundle *BundleStatus `json:"bundle,omitempty"`
}

// BundleStatus is how the daemon's polling of its bundle server goes.
type BundleStatus struct {
	// URL is the bundle URL, any password in it redacted.
	URL string `json:"url"`
	// Origin says where the policy in force came from: "bundle" (fetched
	// by this run), "saved" (the last good bundle of an earlier run) or
	// "fallback" (no good bundle yet: the observe-only policy).
	Origin string `json:"origin"`
	// Revision, ETag and Signature ("verified", "unchecked", "unsigned")
	// are those of the bundle in force; ActivatedAt is when it was swapped
	// in.
	Revision    string    `json:"revision,omitempty"`
	ETag        string    `json:"etag,omitempty"`
	Signature   string    `json:"signature,omitempty"`
	ActivatedAt time.Time `json:"activated_at,omitzero"`
	// SignatureRequired: a key is configured and every bundle must be
	// signed with it.
	SignatureRequired bool `json:"signature_required"`
	// LastFetchAt and LastResult are the latest fetch's (activated,
	// not_modified, unchanged, rejected, failed); LastSuccessAt the latest
	// the server answered; LastFetchError why fetches fail, while they do.
	LastFetchAt    time.Time `json:"last_fetch_at,omitzero"`
	LastResult     string    `json:"last_result,omitempty"`
	LastSuccessAt  time.Time `json:"last_success_at,omitzero"`
	LastFetchError string    `json:"last_fetch_error,omitempty"`
	// LastErrorReason and LastErrorRevision are those of the latest
	// refused bundle (its error is PolicyStatus.LastError).
	LastErrorReason     string    `json:"last_error_reason,omitempty"`
	LastErrorRevision   string    `json:"last_error_revision,omitempty"`
	ConsecutiveFailures int       `json:"consecutive_failures"`
	NextFetchAt         time.Time `json:"next_fetch_at,omitzero"`
	// Fetches counts fetches by result; Failures counts failed fetches
	// and refused bundles by reason (connection, timeout, http_status,
	// token, too_large, bundle, signature, policy, tests).
	Fetches  map[string]uint64 `json:"fetches"`
	Failures map[string]uint64 `json:"failures"`
}

// PolicyRevision is one revision the service applied.
type PolicyRevision struct {
	Revision  string    `json:"revision"`
	AppliedAt time.Time `json:"applied_at"`
	Files     []string  `json:"files"`
	// Origin says how it came: "startup", "file" (changed on disk),
	// "api", "rollback" or "bundle" (from the bundle server).
	Origin  string `json:"origin"`
	Current bool   `json:"current"`
}

// ClassChange is what a policy would decide for one running process.
type ClassChange struct {
	PID       uint32      `json:"pid"`
	Comm      string      `json:"comm"`
	FromClass string      `json:"from_class"`
	ToClass   string      `json:"to_class"`
	FromLevel sched.Level `json:"from_level"`
	ToLevel   sched.Level `json:"to_level"`
	Changed   bool        `json:"changed"`
	Reason    string      `json:"reason,omitempty"`
	// Fallback, when set, is why the new policy's own decision could not
	// be used and its default would apply.
	Fallback string `json:"fallback,omitempty"`
}
