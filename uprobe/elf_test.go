package uprobe

import (
	"bytes"
	"debug/elf"
	"os"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/trace"
)

// libc is the system C library: glibc exports versioned duplicates
// (realpath@GLIBC_2.2.5 and realpath@@GLIBC_2.3) and IFUNCs (memcpy).
func libc(t *testing.T) string {
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/usr/lib64/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no glibc libc.so.6 here")
	return ""
}

func resolveNames(t *testing.T, path string, names ...string) map[string]symbol {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		t.Fatal(err)
	}
	m, err := resolveELF(ef, f, path, func(n string) bool {
		for _, w := range names {
			if n == w {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// dynValues returns every .dynsym value of a bare name, with its version
// marker, independently of the code under test.
func dynValues(t *testing.T, path, name string) map[string]uint64 {
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, s := range syms {
		if s.Name != name || s.Section == elf.SHN_UNDEF {
			continue
		}
		sep := "@@"
		if s.VersionIndex.IsHidden() {
			sep = "@"
		}
		off, _ := fileOffset(ef, s.Value)
		out[name+sep+s.Version] = off
	}
	return out
}

func TestResolveDefaultVersion(t *testing.T) {
	path := libc(t)
	all := dynValues(t, path, "realpath")
	if len(all) < 2 {
		t.Skipf("this libc has no versioned duplicate of realpath: %v", all)
	}
	m := resolveNames(t, path, "realpath")
	got, ok := m["realpath"]
	if !ok {
		t.Fatal("realpath not resolved")
	}
	if !strings.HasPrefix(got.name, "realpath@@") {
		t.Errorf("resolved %s, want the default version realpath@@...", got.name)
	}
	if want := all[got.name]; got.address != want || want == 0 {
		t.Errorf("%s at %#x, want %#x (all: %v)", got.name, got.address, want, all)
	}
	for name, addr := range all {
		if strings.Contains(name, "@") && !strings.Contains(name, "@@") && addr == got.address {
			t.Errorf("resolved to the hidden version's address %#x", addr)
		}
	}
}

func TestResolveIFunc(t *testing.T) {
	path := libc(t)
	m := resolveNames(t, path, "memcpy", "strlen")
	for _, n := range []string{"memcpy", "strlen"} {
		s, ok := m[n]
		if !ok {
			t.Errorf("%s not resolved", n)
			continue
		}
		if !s.ifunc || !strings.HasPrefix(s.name, n+"@@") {
			t.Errorf("%s: resolved %+v, want a default-version ifunc", n, s)
		}
	}
}

func TestResolveStub(t *testing.T) {
	b := cudastub.ForTest(t)
	syms, err := resolveSymbols(b.Lib)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range trace.Funcs() {
		s, ok := syms[f]
		if !ok {
			t.Errorf("%s not resolved in the stub", f)
			continue
		}
		if !bytes.HasPrefix(s.prologue, []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x55}) {
			t.Errorf("%s: prologue % x, the stub is built to start with endbr64; push %%rbp", f, s.prologue)
		}
		if s.offset != 4 {
			t.Errorf("%s: attach offset %d, want 4", f, s.offset)
		}
	}
	got := syms[trace.FuncStreamSynchronize]
	if got.name != "cuStreamSynchronize@@LIBCUDA_2.0" {
		t.Errorf("resolved %s, want cuStreamSynchronize@@LIBCUDA_2.0", got.name)
	}
	all := dynValues(t, b.Lib, "cuStreamSynchronize")
	if old := all["cuStreamSynchronize@LIBCUDA_1.0"]; old == 0 || old == got.address {
		t.Errorf("old version at %#x, default at %#x: the stub must export two distinct bodies (%v)", old, got.address, all)
	}
	if got.address != all[got.name] {
		t.Errorf("default at %#x, .dynsym says %#x", got.address, all[got.name])
	}
}

func TestResolveBadFiles(t *testing.T) {
	dir := t.TempDir()
	b := cudastub.ForTest(t)
	lib, err := os.ReadFile(b.Lib)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"empty":     nil,
		"text":      []byte("not an ELF file\n"),
		"truncated": lib[:200],
	} {
		p := dir + "/" + name
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := resolveSymbols(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: err = %v, want an error naming the file", name, err)
		}
	}
	// A file that is no ELF at all says what to give instead.
	if _, err := resolveSymbols(dir + "/text"); err == nil || !strings.Contains(err.Error(), "is not an ELF shared library (it starts with ") ||
		strings.Contains(err.Error(), "magic number") || !strings.HasSuffix(err.Error(), "give the path of the driver's libcuda.so.1") {
		t.Errorf("text: %v", err)
	}
	if _, err := resolveSymbols(dir); err == nil || !strings.Contains(err.Error(), "read "+dir+": ") || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("a directory: %v", err)
	}
	if _, err := resolveSymbols(dir + "/missing"); err == nil {
		t.Error("missing file resolved")
	}
}

func TestAttachOffset(t *testing.T) {
	endbr := []byte{0xf3, 0x0f, 0x1e, 0xfa}
	cat := func(b ...[]byte) []byte { return bytes.Join(b, nil) }
	tests := []struct {
		name    string
		machine elf.Machine
		code    []byte
		want    uint64
	}{
		{"endbr64 push rbp", elf.EM_X86_64, cat(endbr, []byte{0x55, 0x48, 0x89, 0xe5}), 4},
		{"endbr64 push rbx", elf.EM_X86_64, cat(endbr, []byte{0x53}), 4},
		{"endbr64 push r15", elf.EM_X86_64, cat(endbr, []byte{0x41, 0x57}), 4},
		{"endbr64 nop", elf.EM_X86_64, cat(endbr, []byte{0x90}), 4},
		{"endbr64 jmp", elf.EM_X86_64, cat(endbr, []byte{0xe9, 1, 2, 3, 4}), 4},
		{"endbr64 mov", elf.EM_X86_64, cat(endbr, []byte{0x48, 0x89, 0xe5}), 0},
		{"endbr64 sub rsp", elf.EM_X86_64, cat(endbr, []byte{0x48, 0x83, 0xec, 0x08}), 0},
		{"endbr64 rex.b without push", elf.EM_X86_64, cat(endbr, []byte{0x41, 0x89}), 0},
		{"endbr64 alone", elf.EM_X86_64, endbr, 0},
		{"push rbp without endbr64", elf.EM_X86_64, []byte{0x55, 0x48, 0x89, 0xe5}, 0},
		{"arm64 never moves", elf.EM_AARCH64, cat(endbr, []byte{0x55}), 0},
		{"empty", elf.EM_X86_64, nil, 0},
	}
	for _, tc := range tests {
		if got := attachOffset(tc.machine, tc.code); got != tc.want {
			t.Errorf("%s: offset %d, want %d", tc.name, got, tc.want)
		}
	}
}

func FuzzResolveELF(f *testing.F) {
	b := cudastub.ForTest(f)
	lib, err := os.ReadFile(b.Lib)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(lib)
	f.Add(lib[:64])
	f.Add([]byte("\x7fELF"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		m, err := resolveELF(ef, bytes.NewReader(data), "fuzz", func(string) bool { return true })
		if err != nil {
			return
		}
		for n, s := range m {
			if !strings.HasPrefix(s.name, n) || s.offset > 4 {
				t.Fatalf("%s: %+v", n, s)
			}
		}
	})
}
