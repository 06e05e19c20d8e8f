// Package preflight checks whether a node can run Arbiter, and which
// enforcement levels it supports there: the kernel's BPF facilities and
// this process's privileges, the CUDA driver libraries in use, the NVIDIA
// kernel driver and its version gate, the control devices, and what
// channel control and the launch gate need besides. It is what
// `arbiter doctor` prints.
//
// Every check gives OK, WARN or FAIL with what it found and, where it is
// not OK, what to do. A check names the enforcement levels that need it; a
// level is supported unless one of its checks fails. Kernel, BPF and
// capability checks always test the running kernel and the calling
// process, by loading and attaching small programs where that is the only
// conclusive test (each is detached again at once); the checks of files
// the NVIDIA driver and the libraries provide read them under
// Options.Root, so that a container can look at its host's filesystem and
// tests at a fake tree. Options.OpenNVML replaces the node's NVML in the
// nvml check, so that tests run it against go-nvml's mock servers.
//
// Report.Document is the report as `arbiter doctor --format json` prints
// it, versioned by FormatVersion; Schema is its JSON Schema (draft
// 2020-12), of which docs/doctor.schema.json is a copy.
package preflight
