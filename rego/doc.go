// Package rego embeds Arbiter's Rego policies: the default policy, the
// shared helper library (package arbiter.lib) and the example policies an
// operator starts from. Each policy file has a _test.rego beside it, run by
// `arbiter policy test DIR` and by stock `opa test lib DIR`.
package rego
