// Package gpuvalidate owns the results of Arbiter's validation on a real
// GPU server, scripts/gpu-validate.sh: the line format its sections write
// their findings in, the extraction of findings from what the tools print
// (arbiter trace, arbiter channels, nvrm's hardware procedure, the
// workloads), and the Markdown report rendered from them for
// docs/gpu-validation.md.
//
// The script runs each section as its own process under a time budget and
// appends lines to one results file; nothing in it is Markdown. A line is
// one record, its fields separated by single spaces, the last one free
// text:
//
//	META <key> <text>                          the machine and the run
//	SECTION <section> <status> <seconds> <why>  how a section ended
//	RUN <section> <command>                    what it ran
//	CHECK <section> <name> <status> <seen>     a verdict and what was seen
//	RESULT <section> <name> <value> [<unit>]    a measurement
//	NOTE <section> <text>                      anything else worth saying
//	ATTACH <section> <format> <file> <title>   raw output kept beside it
//
// Status is PASS, FAIL, SKIP or INFO for a check; a section ends DONE,
// SKIP (its prerequisite is missing, and why), TIMEOUT or ERROR. The
// command gpureport (cmd/gpureport) writes the lines the script cannot
// write itself and renders the report; the tests run the script's
// sections on the stub driver and the stand-in control file and check
// both.
package gpuvalidate
