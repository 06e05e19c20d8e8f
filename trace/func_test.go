package trace

import (
	"strings"
	"testing"
)

func TestFuncTableComplete(t *testing.T) {
	seen := map[string]Func{}
	for _, f := range Funcs() {
		info := f.Info()
		if info.Symbol == "" {
			t.Fatalf("Func %d has no symbol", f)
		}
		if !strings.HasPrefix(info.Symbol, "cu") {
			t.Errorf("%s: symbol does not look like a driver API name", info.Symbol)
		}
		if prev, dup := seen[info.Symbol]; dup {
			t.Errorf("symbol %s used by Func %d and %d", info.Symbol, prev, f)
		}
		seen[info.Symbol] = f
		switch info.Kind {
		case KindLaunch, KindSync:
			if info.Dir != CopyUnknown {
				t.Errorf("%s: non-copy has direction %v", info.Symbol, info.Dir)
			}
		case KindCopy:
			if info.Dir == CopyUnknown {
				t.Errorf("%s: copy without direction", info.Symbol)
			}
			if want := strings.Contains(info.Symbol, "Async"); info.Async != want {
				t.Errorf("%s: Async = %v, want %v", info.Symbol, info.Async, want)
			}
		default:
			t.Errorf("%s: kind %v is not launch, copy or sync", info.Symbol, info.Kind)
		}
		if got, ok := FuncBySymbol(info.Symbol); !ok || got != f {
			t.Errorf("FuncBySymbol(%q) = %v, %v; want %v", info.Symbol, got, ok, f)
		}
		if f.String() != info.Symbol {
			t.Errorf("String() = %q, want %q", f.String(), info.Symbol)
		}
	}
	if len(seen) != int(funcCount)-1 {
		t.Errorf("%d symbols for %d funcs", len(seen), funcCount-1)
	}
}

func TestFuncInvalid(t *testing.T) {
	for _, f := range []Func{FuncNone, funcCount, 255} {
		if f.Valid() {
			t.Errorf("Func %d reported valid", f)
		}
		if f.Info() != (FuncInfo{}) {
			t.Errorf("Func %d has info", f)
		}
	}
	if FuncNone.String() != "none" || Func(200).String() != "func(200)" {
		t.Errorf("names of invalid funcs: %q %q", FuncNone, Func(200))
	}
	if _, ok := FuncBySymbol("cuNope"); ok {
		t.Error("unknown symbol resolved")
	}
}

func TestKindNames(t *testing.T) {
	want := map[Kind]string{KindLaunch: "launch", KindCopy: "copy", KindSync: "sync",
		KindExec: "exec", KindExit: "exit", KindRMAlloc: "rm_alloc", KindRMFree: "rm_free",
		KindRMControl: "rm_control", 99: "kind(99)"}
	for k, name := range want {
		if k.String() != name {
			t.Errorf("Kind(%d).String() = %q, want %q", k, k.String(), name)
		}
		if k.Valid() != (k != 99) {
			t.Errorf("Kind(%d).Valid() = %v", k, k.Valid())
		}
	}
	if KindInvalid.Valid() {
		t.Error("KindInvalid is valid")
	}
}

func TestCommString(t *testing.T) {
	var p Proc
	copy(p.Comm[:], "python3")
	if p.CommString() != "python3" {
		t.Errorf("got %q", p.CommString())
	}
	copy(p.Comm[:], "0123456789abcdef")
	if p.CommString() != "0123456789abcdef" {
		t.Errorf("full comm: got %q", p.CommString())
	}
}
