package bpf

// The generated loaders (nvrm_x86_bpfel.go, nvrm_arm64_bpfel.go) and objects
// are committed; `make generate` rebuilds them with clang.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target amd64,arm64 -type nvrm_record Nvrm nvrm.c -- -O2 -g -Wall -Werror -I/usr/include/bpf -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu

// Record kinds of the nvrm program's nvrm_record.kind.
const (
	// NVRMRecordAlloc is a successful RM_ALLOC (NVOS21 or NVOS64 block).
	NVRMRecordAlloc uint8 = 1
	// NVRMRecordFree is a successful RM_FREE (NVOS00 block).
	NVRMRecordFree uint8 = 2
	// NVRMRecordControl is a successful channel-group RM_CONTROL (NVOS54).
	NVRMRecordControl uint8 = 3
	// NVRMRecordExit is the exit of a process that issued recorded calls.
	NVRMRecordExit uint8 = 4
)

// Indices of the nvrm program's nvrm_drops per-CPU counters.
const (
	// NVRMDropRingbuf counts records lost to a full ring buffer.
	NVRMDropRingbuf = 0
	// NVRMDropRead counts parameter blocks unreadable at sys_exit.
	NVRMDropRead = 1
	// NVRMDropInflight counts calls lost to a full in-flight map.
	NVRMDropInflight = 2
)
