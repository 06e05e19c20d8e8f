// Package workload describes what runs on the simulated GPUs: latency-
// critical (LC) request streams and best-effort (BE) kernel streams from a
// YAML or JSON spec, and processes replayed from a trace recorded by
// `arbiter trace --record`. It turns them into sim.Program values that are
// deterministic for a seed and independent of scheduling: every workload
// draws its arrivals, and a seed per request, from two PCG generators of
// its own, seeded from the run's seed and the workload's name, and each
// request's or cycle's service times from a SplitMix64 generator seeded
// by the request's seed or the cycle's number, so the same requests with
// the same kernels reach the GPU under every baseline.
package workload
