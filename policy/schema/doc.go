// Package schema owns Arbiter's published JSON Schemas — the policy input
// (input.json), the classification decision (decision.json) and the
// victims decision (victims.json), embedded byte for byte — and the
// validator that checks documents against them.
//
// [Load] compiles the three; [Schema.Validate] checks a decoded JSON
// value and [Schema.ValidateAST] a value in OPA's AST without converting
// it, each returning the first violation as a [FieldError] with a dotted
// field path (preemption.mode, suspend[2].pid); [Schema.ValidateAll]
// returns every one, for documents a person wrote. Only the keywords the
// published schemas use are supported, and [Compile] rejects any other.
// [Document] is how the validator, and decoders of validated documents,
// read either form of value.
//
// `arbiter policy schema NAME` prints [JSON]; docs/policy.md describes
// the fields.
package schema
