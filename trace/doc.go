// Package trace defines Arbiter's event model and its trace-file format.
//
// An Event is one observed CUDA driver call (a kernel launch, a host/device
// copy, a synchronizing call with its duration and result), a process
// lifecycle change (exec, exit) or a traced NVIDIA Resource Manager call.
// Every event source (the eBPF probes, a replayed file, the simulator)
// produces these values, and every consumer (the engine, the CLI, the web
// console) reads them. The package imports only the standard library.
package trace
