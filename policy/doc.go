// Package policy loads, checks, tests and evaluates Arbiter's Rego policies
// with the embedded OPA engine, and compiles their decisions into the plan
// the engine's fast path reads without calling OPA.
//
// A policy is a directory or an OPA bundle with package arbiter defining
// classify and default_decision (and optionally victims), Rego tests, and
// optional data.json/data.yaml files. [Load] reads and compiles it strictly,
// with every input reference checked against the published input schema
// (policy/schema, input.json) and every literal decision against the
// decision schema; errors carry file, row, column and OPA's error code
// ([Error]).
//
// [ReadBundle] reads a bundle held in memory (one fetched from a bundle
// server, package policy/fetch): every file counts against the size
// limits first, and with [BundleOptions.Verification] the bundle must be
// signed in OPA's bundle signing format with every file intact, or it is
// refused with [CodeSignature] before any of it is parsed.
//
// [Policy.Classify] decides one process's class and preemption; the input
// is the process as policy/input reads it from /proc, and the node's GPUs.
// Every decision is checked
// against schema/decision.json: one that does not fit, or an evaluation that
// fails or outlives its deadline, yields the policy's default decision and
// a [DecisionError] naming the process and the field. [Policy.Victims] is the
// control loop's entry point. [Decision.Compile] turns decisions
// into plain Go values.
//
// [Watch] keeps a directory's policy in force: it reloads on change, runs
// the policy's own Rego tests ([Test]) and swaps atomically only when all
// pass; otherwise the last good policy stays and [Watcher.Status] says why.
//
// The package never logs: print() output goes to [Options.Print].
// See docs/policy.md for the operator's guide.
package policy
