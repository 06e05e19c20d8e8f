// Package nvmltest completes go-nvml's DGX mock servers for tests of code
// that reads NVML through package gpu: HGX fills in what the mocks leave
// nil (PCI bus ids, NUMA nodes, NVLinks through NVSwitches, the PCIe
// topology, empty process lists); Opener opens a server's inventory
// wherever a gpu.Opener is taken (doctor's NVML check); and Calls counts
// every call that reached a server, so that a test can assert that
// nothing reached NVML after a failed Init or after Close.
//
// go-nvml's mocks, like the rest of go-nvml, need cgo: in a build without
// it this package is empty.
package nvmltest
