// Package fetch keeps a policy from an OPA-compatible bundle server in
// force: a [Poller] polls one bundle URL, and swaps in a bundle only after
// the checks a policy directory gets (package policy: load, strict
// compilation, the schema checks, and the bundle's own Rego tests), so a
// bundle that fails any of them, or its signature, never applies and the
// last good policy stays.
//
// Polling follows OPA's bundle protocol: a conditional GET with the ETag
// of the last answer (304 Not Modified keeps what is in force), a bearer
// token read from a file at every request, a bound on the size of the
// download enforced while reading it, a timeout per request, a poll
// interval with random jitter so that a fleet does not poll in step, and
// exponential backoff with jitter after a failure, reset by the next
// answer.
//
// Signatures use OPA's bundle signing format (.signatures.json, as
// `opa build --signing-key` writes it), verified with OPA's own bundle
// reader: [LoadKey] turns a public key file (or an HMAC secret) into the
// verification config. With a key, an unsigned or tampered bundle is
// refused; without one, a signed bundle is read without checking its
// signature, and the [Status] says so.
//
// Until a bundle passes, the policy in force is the caller's fallback, or
// the last good bundle an earlier run saved ([Options.SaveFile]), checked
// again the same way. The package never logs: every fetch ends in an
// [Event] for the caller, and [Poller.Status] sums them up.
package fetch
