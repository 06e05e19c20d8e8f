// Package uprobe captures CUDA driver API calls of unmodified processes with
// eBPF uprobes on libcuda.
//
// Open finds every distinct libcuda file in use on the node (mapped by a
// running process, named by the dynamic linker's cache or a standard library
// directory, or reached inside a container through /proc/PID/root),
// de-duplicated by device and inode; it resolves each probed symbol's
// default version from .dynsym, chooses an attach offset the kernel can
// emulate rather than single-step, and attaches the programs of package bpf
// to every variant the library exports: one uprobe_multi link per program
// (kernel 6.6+), else one perf-event uprobe per site. With a PID list the
// breakpoints are installed in those processes only, so unlisted processes
// pay nothing. A periodic rescan, and a look at each process right after
// its exec, attach library files that appear later (a new container, a
// driver upgrade) and the rescan detaches those that vanish. A probed
// function exported as a GNU indirect function (IFUNC) gets a return probe
// on its resolver; the first traced process that resolves it tells which
// implementation the resolver chose, and that is probed from then on.
//
// One goroutine drains the ring buffer, polling with a short deadline
// because the probes wake it only past a fill threshold, and decodes the
// records into trace.Event values without allocating; Read hands them out.
// Records the kernel could not queue because the ring was full are counted
// (Stats.Drops), never waited for: the traced application is not slowed
// beyond the probe's own cost.
//
// The launch probes also hold the launch gate (Gate, from Tracer.Gate): a
// gated process is stopped with SIGSTOP by its own launch probe at its next
// kernel launch, and continued when its gate opens, only if the gate
// stopped it. The gate's maps can be pinned (Options.GatePinDir) so that a
// restarted daemon, or `arbiter recover` (OpenGate), finds the processes a
// killed one left gated, and those it left stopped while it opened their
// gates.
//
// Decode is pure and needs no privileges; everything else needs CAP_BPF and
// CAP_PERFMON (or root) and a kernel with BPF cookies (5.15+).
package uprobe
