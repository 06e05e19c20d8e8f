package uprobe

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"

	"github.com/gpu-arbiter/arbiter/bpf"
)

// programs are the loaded uprobe programs of one set: bpf/cuda.c defines
// each twice, for uprobe_multi links (kernel 6.6+) and for single
// perf-event uprobes, and only the set the kernel can attach is loaded.
type programs struct {
	launch, launchEx, args, sync, retSync, ifunc, noop *ebpf.Program
	// multi says the set is for uprobe_multi links.
	multi bool
}

// The two sets, as LoadAndAssign targets.
type singlePrograms struct {
	Launch   *ebpf.Program `ebpf:"uprobe_launch"`
	LaunchEx *ebpf.Program `ebpf:"uprobe_launch_ex"`
	Args     *ebpf.Program `ebpf:"uprobe_args"`
	Sync     *ebpf.Program `ebpf:"uprobe_sync"`
	RetSync  *ebpf.Program `ebpf:"uretprobe_sync"`
	IFunc    *ebpf.Program `ebpf:"uretprobe_ifunc"`
	Noop     *ebpf.Program `ebpf:"uprobe_noop"`
}

type multiPrograms struct {
	Launch   *ebpf.Program `ebpf:"uprobe_launch_multi"`
	LaunchEx *ebpf.Program `ebpf:"uprobe_launch_ex_multi"`
	Args     *ebpf.Program `ebpf:"uprobe_args_multi"`
	Sync     *ebpf.Program `ebpf:"uprobe_sync_multi"`
	RetSync  *ebpf.Program `ebpf:"uretprobe_sync_multi"`
	IFunc    *ebpf.Program `ebpf:"uretprobe_ifunc_multi"`
	Noop     *ebpf.Program `ebpf:"uprobe_noop_multi"`
}

// tracepointPrograms are the exec/exit programs, attached to the raw
// sched_process_exec and sched_process_exit tracepoints.
type tracepointPrograms struct {
	Exec *ebpf.Program `ebpf:"sched_exec"`
	Exit *ebpf.Program `ebpf:"sched_exit"`
}

// variables are the programs' globals the Tracer changes while they run.
type variables struct {
	ExpediteListed *ebpf.Variable `ebpf:"expedite_listed"`
}

// objects is everything the Tracer loads.
type objects struct {
	maps  bpf.CudaMaps
	tps   tracepointPrograms
	vars  variables
	progs programs
}

// load loads the maps, the tracepoint programs and one uprobe program set
// from spec: the uprobe_multi set where the kernel has it, unless single
// forces the perf-event set. opts (nil allowed) carries the pin directory
// of the maps pinned by name.
func load(spec *ebpf.CollectionSpec, single bool, opts *ebpf.CollectionOptions) (*objects, error) {
	o := &objects{}
	multi := !single && features.HaveBPFLinkUprobeMulti() == nil
	var err error
	if multi {
		var p multiPrograms
		err = spec.LoadAndAssign(&struct {
			*bpf.CudaMaps
			*tracepointPrograms
			*variables
			*multiPrograms
		}{&o.maps, &o.tps, &o.vars, &p}, opts)
		o.progs = programs{p.Launch, p.LaunchEx, p.Args, p.Sync, p.RetSync, p.IFunc, p.Noop, true}
	} else {
		var p singlePrograms
		err = spec.LoadAndAssign(&struct {
			*bpf.CudaMaps
			*tracepointPrograms
			*variables
			*singlePrograms
		}{&o.maps, &o.tps, &o.vars, &p}, opts)
		o.progs = programs{p.Launch, p.LaunchEx, p.Args, p.Sync, p.RetSync, p.IFunc, p.Noop, false}
	}
	if err != nil {
		return nil, fmt.Errorf("load CUDA probes (needs CAP_BPF and CAP_PERFMON; on kernels before 5.11 MEMLOCK may be too low, consider rlimit.RemoveMemlock): %w", err)
	}
	return o, nil
}

// close frees programs and maps.
func (o *objects) close() error {
	var errs []error
	for _, p := range []*ebpf.Program{o.progs.noop, o.progs.ifunc, o.progs.retSync, o.progs.sync, o.progs.args, o.progs.launchEx, o.progs.launch, o.tps.Exit, o.tps.Exec} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	errs = append(errs, o.maps.Close())
	return errors.Join(errs...)
}
