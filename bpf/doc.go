// Package bpf holds Arbiter's eBPF programs and their bpf2go-generated
// loaders: cuda.c (uprobes on the CUDA driver API's launch, copy and sync
// functions, process exec/exit tracepoints and the event ring buffer; the
// uprobe package loads and attaches it) and nvrm.c (the NVIDIA Resource
// Manager ioctl tracer).
//
// The C sources are compiled with clang by `make generate`; the generated
// Go files and objects for amd64 and arm64 are committed so that Arbiter
// builds with the Go toolchain alone. The C programs are dual-licensed
// "Dual BSD/GPL": the kernel offers some helpers they use
// (bpf_probe_read_user, bpf_probe_read_kernel behind CO-RE reads,
// bpf_get_current_task) only to programs that declare a GPL-compatible
// licence.
package bpf
