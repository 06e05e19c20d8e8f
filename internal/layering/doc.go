// Package layering holds the test that keeps Arbiter's import rules (see
// docs/architecture.md, "Packages"): the engine imports no mechanism and no
// OPA, the mechanisms import no engine, policy, web or simulator, and only
// the command imports the web server. It has no code of its own.
package layering
