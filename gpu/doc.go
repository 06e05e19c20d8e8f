// Package gpu reads the node's GPU inventory through NVML (NVIDIA's
// management library, loaded at run time through go-nvml): the GPUs with
// their UUIDs, memory, PCI and NUMA placement; the NVLink and PCIe topology
// between them; the driver versions; and the processes on each GPU with
// their memory and utilization.
//
// Everything is behind the Inventory interface. Open loads the node's
// libnvidia-ml.so.1; New takes any go-nvml nvml.Interface, which is how the
// tests run against go-nvml's own DGX mock servers (completed by package
// nvmltest). Check, what `arbiter doctor` shows, opens an inventory
// through an Opener: Open, or in tests a mock server's.
//
// go-nvml ends the process on a call that reaches NVML before a successful
// Init, and on a call to a function the node's NVML does not export. This
// package therefore checks that the library exports nvmlInit before loading
// it, never calls anything after a failed Init or after Close, and looks up
// every function it uses once Init succeeds: a function the driver lacks
// makes its fields unsupported instead of being called. When NVML cannot be
// used at all, Open returns an error that matches ErrUnavailable, and the
// daemon runs with the GPUs it learns from the driver trace.
//
// go-nvml needs cgo, even for its types. In a build without cgo
// (CGO_ENABLED=0) Open reports NVML unavailable and says so; New exists only
// in cgo builds. docs/architecture.md ("NVML and cgo") says which build ships
// and what it needs of the host.
package gpu
