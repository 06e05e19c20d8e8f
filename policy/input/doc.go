// Package input builds the process part of a policy's classification
// input (input.process, schema/input.json) from /proc and the caller's
// pod data: [ReadProcess] reads a process through procfs (comm, exe,
// command line, user, cgroup, the allowed ARBITER_* environment variables,
// the GPUs it has open), and [ParseCgroup] reads what a cgroup path says
// about the container and Kubernetes pod a process runs in.
//
// The types here are plain data with the input's JSON field names; the
// policy package builds its evaluation input from them.
package input
