// Package cudastub builds a stub CUDA driver, libcuda.so.1, and two workload
// programs linked against it, so that Arbiter's probes, tests and demo run on
// machines without a GPU.
//
// The C sources beside this file are embedded and compiled with the system's
// gcc. The library exports every driver API function Arbiter probes (see
// trace.Funcs) with the real signatures from NVIDIA's cuda.h, plus the setup
// calls a program needs, and emulates execution time: launches and async
// copies queue on their stream, a launch whose kernelParams[0] points to a
// uint64 adds that many nanoseconds of kernel time, copies move 12 GB/s, and
// synchronizing calls block until the work they wait on is done.
//
// Every process on the node that uses GPU index N shares one emulated GPU
// N, kept in POSIX shared memory (/dev/shm/arbiter-stubgpu-N) and
// time-sliced between processes as NVIDIA's scheduler time-slices channel
// groups: round-robin among those with work queued, each for its timeslice
// (1024 µs, or ARBITER_STUB_TIMESLICE_US) or until it runs out of work. The
// schedule is advanced by whichever process calls into the driver, so a
// stopped process's queued work still runs, and no lock exists that a
// stopped or killed process could hold. CUDA_VISIBLE_DEVICES picks the GPU
// indexes a process sees; ARBITER_STUB_NODE gives a set of processes GPUs of
// their own (tests). The stubgpu program (Build.GPUTool, ReadGPU) shows a
// GPU's schedule as JSON. It is
// compiled so that every probed function starts with `endbr64; push %rbp`,
// the prologue the attach-offset logic is tested on, and it exports
// cuStreamSynchronize twice (the default @@LIBCUDA_2.0 and an older
// @LIBCUDA_1.0) to catch tracers that attach to the wrong duplicate.
//
// The workloads are infer (requests of copy, launches, copy, sync arriving
// at a Poisson rate; prints latency percentiles at exit) and train (an
// endless stream of long launches with periodic syncs; prints launches/s
// and checks that none was lost). Both end with a JSON report on stdout
// (InferReport, TrainReport).
package cudastub
