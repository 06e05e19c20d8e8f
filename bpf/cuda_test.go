package bpf

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// ctxOffsets returns the offsets of the context (the register file) that a
// program loads from: R1 at entry and every register copied from it.
func ctxOffsets(t *testing.T, obj, prog string) []int16 {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := spec.Programs[prog]
	if !ok {
		t.Fatalf("%s has no program %s", obj, prog)
	}
	// Registers and stack slots (clang spills the context) holding it.
	ctx := map[asm.Register]bool{asm.R1: true}
	slots := map[int16]bool{}
	var offs []int16
	for _, ins := range p.Instructions {
		class := ins.OpCode.Class()
		switch {
		case class == asm.LdXClass && ins.Src == asm.RFP:
			if slots[ins.Offset] {
				ctx[ins.Dst] = true
			} else {
				delete(ctx, ins.Dst)
			}
		case class == asm.LdXClass && ctx[ins.Src]:
			if !slices.Contains(offs, ins.Offset) {
				offs = append(offs, ins.Offset)
			}
			delete(ctx, ins.Dst)
		case class == asm.StXClass && ins.Dst == asm.RFP:
			if ctx[ins.Src] {
				slots[ins.Offset] = true
			} else {
				delete(slots, ins.Offset)
			}
		case class.IsALU() && ins.OpCode.ALUOp() == asm.Mov && ins.OpCode.Source() == asm.RegSource:
			if ctx[ins.Src] {
				ctx[ins.Dst] = true
			} else {
				delete(ctx, ins.Dst)
			}
		case ins.IsFunctionCall() || ins.IsBuiltinCall():
			// Calls clobber R0-R5.
			for r := asm.R0; r <= asm.R5; r++ {
				delete(ctx, r)
			}
		case class.IsALU() || class.IsLoad():
			delete(ctx, ins.Dst)
		}
	}
	slices.Sort(offs)
	return offs
}

// TestRegisterOffsets checks, for both targets, which registers each
// program reads: the calling conventions' argument registers, the stack
// pointer for stack-passed arguments, the return register. The arm64
// object is checked on any host, so a wrong AAPCS64 mapping fails here
// without an arm64 machine.
func TestRegisterOffsets(t *testing.T) {
	// struct pt_regs (x86-64): r15 0, ... r9 64, r8 72, ax 80, cx 88, dx 96,
	// si 104, di 112, ..., sp 152. user_pt_regs (arm64): x0-x30 at 8*n, sp
	// 248.
	tests := []struct {
		obj, prog string
		want      []int16
	}{
		// di..r9 and sp (7th to 9th arguments on the stack).
		{"cuda_x86_bpfel.o", "uprobe_launch", []int16{64, 72, 88, 96, 104, 112, 152}},
		// x0-x7 and sp (9th argument on the stack).
		{"cuda_arm64_bpfel.o", "uprobe_launch", []int16{0, 8, 16, 24, 32, 40, 48, 56, 248}},
		// config pointer (1st) and function (2nd).
		{"cuda_x86_bpfel.o", "uprobe_launch_ex", []int16{104, 112}},
		{"cuda_arm64_bpfel.o", "uprobe_launch_ex", []int16{0, 8}},
		// four register arguments.
		{"cuda_x86_bpfel.o", "uprobe_args", []int16{88, 96, 104, 112}},
		{"cuda_arm64_bpfel.o", "uprobe_args", []int16{0, 8, 16, 24}},
		{"cuda_x86_bpfel.o", "uprobe_sync", []int16{104, 112}},
		{"cuda_arm64_bpfel.o", "uprobe_sync", []int16{0, 8}},
		// the return value.
		{"cuda_x86_bpfel.o", "uretprobe_sync", []int16{80}},
		{"cuda_arm64_bpfel.o", "uretprobe_sync", []int16{0}},
		{"cuda_x86_bpfel.o", "uretprobe_ifunc", []int16{80}},
		{"cuda_arm64_bpfel.o", "uretprobe_ifunc", []int16{0}},
	}
	for _, tc := range tests {
		for _, name := range []string{tc.prog, tc.prog + "_multi"} {
			if got := ctxOffsets(t, tc.obj, name); !slices.Equal(got, tc.want) {
				t.Errorf("%s %s reads context offsets %v, want %v", tc.obj, name, got, tc.want)
			}
		}
	}
}
