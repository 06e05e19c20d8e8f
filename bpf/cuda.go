package bpf

// The generated loaders (cuda_x86_bpfel.go, cuda_arm64_bpfel.go) and objects
// are committed; `make generate` rebuilds them with clang.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target amd64,arm64 -type event -type gate_entry -type armed Cuda cuda.c -- -O2 -g -Wall -Werror -I/usr/include/bpf -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu

// CookieKindShift is where the event kind sits in a uprobe's BPF cookie: a
// cookie is uint64(trace.Func) | uint64(trace.Kind)<<CookieKindShift.
const CookieKindShift = 8

// Filter modes of the CUDA programs' filter_mode variable.
const (
	// FilterAll traces every process.
	FilterAll uint8 = 0
	// FilterListed traces only processes whose tgid is in the filter_tgids
	// map or whose cgroup v2 id is in filter_cgroups.
	FilterListed uint8 = 1
)
