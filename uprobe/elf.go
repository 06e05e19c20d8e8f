package uprobe

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/gpu-arbiter/arbiter/trace"
)

// prologueLen is how many bytes of each probed function are kept.
const prologueLen = 16

// symbol is a probed function resolved in one library file.
type symbol struct {
	// name is the symbol with its version: "cuX@@V", "cuX@V" or "cuX".
	name string
	// address is the function's file offset; offset where to attach
	// relative to it.
	address, offset uint64
	prologue        []byte
	// ifunc marks a GNU indirect function: address is its resolver, and
	// the implementation is known only once a process has run it.
	ifunc bool
	// machine is the library's architecture (for attachOffset).
	machine elf.Machine
}

// resolveSymbols finds every probed function in the shared object at path:
// for each bare name the default-version (or unversioned) defined dynamic
// symbol, its file offset and its attach offset.
func resolveSymbols(path string) (map[trace.Func]symbol, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	magic := make([]byte, 4)
	n, err := f.ReadAt(magic, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if n < 4 || string(magic) != elf.ELFMAG {
		return nil, fmt.Errorf("%s is not an ELF shared library (it starts with %q, not %q): give the path of the driver's libcuda.so.1",
			path, magic[:n], elf.ELFMAG)
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid ELF shared library (%w): give the path of the driver's libcuda.so.1", path, err)
	}
	defer ef.Close()
	byName, err := resolveELF(ef, f, path, func(name string) bool {
		_, ok := trace.FuncBySymbol(name)
		return ok
	})
	if err != nil {
		return nil, err
	}
	m := make(map[trace.Func]symbol, len(byName))
	for name, sym := range byName {
		fn, _ := trace.FuncBySymbol(name)
		m[fn] = sym
	}
	return m, nil
}

// resolveELF resolves the defined dynamic function symbols whose bare name
// want accepts, keyed by bare name; r reads the raw file for the prologues.
func resolveELF(ef *elf.File, r io.ReaderAt, path string, want func(string) bool) (m map[string]symbol, err error) {
	// debug/elf panics on some corrupt inputs; a bad library must be an
	// error, never a crash of the daemon.
	defer func() {
		if p := recover(); p != nil {
			m, err = nil, fmt.Errorf("parse ELF %s: corrupt file: %v", path, p)
		}
	}()
	if ef.Type != elf.ET_DYN && ef.Type != elf.ET_EXEC {
		return nil, fmt.Errorf("parse ELF %s: type %v is not a shared object", path, ef.Type)
	}
	syms, err := ef.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("read .dynsym of %s: %w", path, err)
	}
	m = make(map[string]symbol)
	for _, s := range syms {
		if !want(s.Name) || s.Section == elf.SHN_UNDEF || s.Value == 0 {
			continue
		}
		typ := elf.ST_TYPE(s.Info)
		if typ != elf.STT_FUNC && typ != elf.STT_GNU_IFUNC {
			continue
		}
		// A hidden version (name@V, not name@@V) is an older ABI kept for
		// old binaries; new links bind to the default.
		if s.HasVersion && s.VersionIndex.IsHidden() {
			continue
		}
		name := s.Name
		if s.HasVersion && s.Version != "" {
			name += "@@" + s.Version
		}
		if prev, dup := m[s.Name]; dup {
			return nil, fmt.Errorf("read .dynsym of %s: %s defined twice as default (%s and %s)", path, s.Name, prev.name, name)
		}
		off, ok := fileOffset(ef, s.Value)
		if !ok {
			return nil, fmt.Errorf("read .dynsym of %s: %s at %#x is in no executable segment", path, name, s.Value)
		}
		sym := symbol{name: name, address: off, ifunc: typ == elf.STT_GNU_IFUNC, machine: ef.Machine}
		code := make([]byte, prologueLen)
		n, _ := r.ReadAt(code, int64(off))
		sym.prologue = code[:n]
		if !sym.ifunc {
			sym.offset = attachOffset(ef.Machine, sym.prologue)
		}
		m[s.Name] = sym
	}
	return m, nil
}

// fileOffset converts a virtual address to a file offset through the
// executable PT_LOAD segment that holds it (the kernel's uprobes take file
// offsets).
func fileOffset(ef *elf.File, vaddr uint64) (uint64, bool) {
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 {
			continue
		}
		if p.Vaddr <= vaddr && vaddr < p.Vaddr+p.Memsz {
			return vaddr - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}

// endbr64 is the x86-64 IBT landing pad (f3 0f 1e fa).
var endbr64 = [4]byte{0xf3, 0x0f, 0x1e, 0xfa}

// attachOffset returns where to place a function's uprobe relative to its
// entry. The kernel must single-step an out-of-line copy of most probed
// instructions (endbr64 among them), which costs several times more than
// the few it emulates in place (push, nop, jmp, call). Where x86-64 code
// starts with endbr64 followed by an emulated instruction, the probe goes
// after the endbr64: the stack and argument registers there are still
// exactly as at entry, so the programs read the same arguments.
func attachOffset(machine elf.Machine, code []byte) uint64 {
	if machine != elf.EM_X86_64 || len(code) < 5 || [4]byte(code[:4]) != endbr64 {
		return 0
	}
	if emulated(code[4:]) {
		return 4
	}
	return 0
}

// emulated reports whether the x86-64 instruction at the start of code is
// one the kernel's uprobes emulate rather than single-step
// (arch/x86/kernel/uprobes.c: push_setup_xol_ops, branch_setup_xol_ops).
func emulated(code []byte) bool {
	switch op := code[0]; {
	case op >= 0x50 && op <= 0x57: // push %rax..%rdi
		return true
	case op == 0x41 && len(code) > 1 && code[1] >= 0x50 && code[1] <= 0x57: // push %r8..%r15
		return true
	case op == 0x90: // nop
		return true
	case op == 0x66 && len(code) > 1 && code[1] == 0x90: // xchg %ax,%ax
		return true
	case op == 0xe8, op == 0xe9, op == 0xeb: // call, jmp rel32, jmp rel8
		return true
	}
	return false
}
