// Package bpf holds Arbiter's eBPF programs and their bpf2go-generated
// loaders.
//
// The C sources are compiled with clang by `make generate`; the generated
// Go files and objects for amd64 and arm64 are committed so that Arbiter
// builds with the Go toolchain alone. The C programs are dual-licensed
// "Dual BSD/GPL": the kernel's GPL-only helpers (bpf_send_signal,
// bpf_probe_read_user_str and the ring buffer among them) are available
// only to programs that declare a GPL-compatible licence.
package bpf
