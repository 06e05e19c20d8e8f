package nvrm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/gpu-arbiter/arbiter/sched"
)

// field is one struct member's name and offset.
type field struct {
	name string
	off  uintptr
}

// golden are the layouts of NVRM.md (nvos.h and the control headers),
// identical on amd64 and arm64 (natural alignment, little-endian). Padding
// members are not listed.
var golden = []struct {
	name   string
	typ    reflect.Type
	size   uintptr
	fields []field
}{
	{"NVOS00", reflect.TypeFor[NVOS00](), 16, []field{{"HRoot", 0}, {"HObjectParent", 4}, {"HObjectOld", 8}, {"Status", 12}}},
	{"NVOS21", reflect.TypeFor[NVOS21](), 32, []field{{"HRoot", 0}, {"HObjectParent", 4}, {"HObjectNew", 8}, {"HClass", 12}, {"PAllocParms", 16}, {"ParamsSize", 24}, {"Status", 28}}},
	{"NVOS64", reflect.TypeFor[NVOS64](), 48, []field{{"HRoot", 0}, {"HObjectParent", 4}, {"HObjectNew", 8}, {"HClass", 12}, {"PAllocParms", 16}, {"PRightsRequested", 24}, {"ParamsSize", 32}, {"Flags", 36}, {"Status", 40}}},
	{"NVOS54", reflect.TypeFor[NVOS54](), 32, []field{{"HClient", 0}, {"HObject", 4}, {"Cmd", 8}, {"Flags", 12}, {"Params", 16}, {"ParamsSize", 24}, {"Status", 28}}},
	{"XferCmd", reflect.TypeFor[XferCmd](), 16, []field{{"Cmd", 0}, {"Size", 4}, {"Ptr", 8}}},
	{"ChannelGroupAllocParams", reflect.TypeFor[ChannelGroupAllocParams](), 20, []field{{"HObjectError", 0}, {"HObjectEccError", 4}, {"HVASpace", 8}, {"EngineType", 12}, {"BIsCallingContextVgpuPlugin", 16}}},
	{"ScheduleParams", reflect.TypeFor[ScheduleParams](), 3, []field{{"BEnable", 0}, {"BSkipSubmit", 1}, {"BSkipEnable", 2}}},
	{"TimesliceParams", reflect.TypeFor[TimesliceParams](), 8, []field{{"TimesliceUs", 0}}},
	{"PreemptParams", reflect.TypeFor[PreemptParams](), 8, []field{{"BWait", 0}, {"BManualTimeout", 1}, {"TimeoutUs", 4}}},
	{"GetInfoParams", reflect.TypeFor[GetInfoParams](), 4, []field{{"TSGID", 0}}},
	{"InterleaveParams", reflect.TypeFor[InterleaveParams](), 4, []field{{"Level", 0}}},
	{"FIFODisableChannelsParams", reflect.TypeFor[FIFODisableChannelsParams](), 536, []field{{"BDisable", 0}, {"NumChannels", 4}, {"BOnlyDisableScheduling", 8}, {"BRewindGpPut", 9}, {"PRunlistPreemptEvent", 16}, {"HClientList", 24}, {"HChannelList", 280}}},
	{"RunlistSchedPolicyParams", reflect.TypeFor[RunlistSchedPolicyParams](), 8, []field{{"Flags", 0}, {"SchedPolicy", 4}}},
	// Drivers 525.x and 530.x (before 535.43.02), which LayoutFor refuses:
	// no paramsSize. Recorded so that the refusal's reasons are checked.
	{"nvos21Pre535", reflect.TypeFor[nvos21Pre535](), 32, []field{{"HRoot", 0}, {"HObjectParent", 4}, {"HObjectNew", 8}, {"HClass", 12}, {"PAllocParms", 16}, {"Status", 24}}},
	{"nvos64Pre535", reflect.TypeFor[nvos64Pre535](), 40, []field{{"HRoot", 0}, {"HObjectParent", 4}, {"HObjectNew", 8}, {"HClass", 12}, {"PAllocParms", 16}, {"PRightsRequested", 24}, {"Flags", 32}, {"Status", 36}}},
}

// TestLayoutHost checks every struct's size and named offsets on the
// architecture the tests run on.
func TestLayoutHost(t *testing.T) {
	for _, g := range golden {
		if g.typ.Size() != g.size {
			t.Errorf("%s: size %d, want %d", g.name, g.typ.Size(), g.size)
		}
		checkFields(t, g.name, g.fields, func(name string) (uintptr, bool) {
			f, ok := g.typ.FieldByName(name)
			return f.Offset, ok
		})
		// Every exported member is in the table: nothing unchecked.
		for i := range g.typ.NumField() {
			f := g.typ.Field(i)
			if f.IsExported() && !hasField(g.fields, f.Name) {
				t.Errorf("%s.%s is not in the golden table", g.name, f.Name)
			}
		}
	}
	// And with unsafe, independent of reflect.
	if unsafe.Sizeof(NVOS64{}) != 48 || unsafe.Offsetof(NVOS64{}.Status) != 40 || unsafe.Offsetof(NVOS54{}.Params) != 16 ||
		unsafe.Sizeof(PreemptParams{}) != 8 || unsafe.Offsetof(PreemptParams{}.TimeoutUs) != 4 {
		t.Error("unsafe layout differs from the golden table")
	}
}

// TestLayoutArchitectures computes the same layouts for amd64 and arm64
// from the source, with the gc compiler's size rules of each, so both are
// checked wherever the test runs.
func TestLayoutArchitectures(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "abi.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	conf := types.Config{Importer: importer.Default()}
	pkg, err := conf.Check("nvrm", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		sizes := types.SizesFor("gc", arch)
		for _, g := range golden {
			obj := pkg.Scope().Lookup(g.name)
			if obj == nil {
				t.Fatalf("%s: type %s not in abi.go", arch, g.name)
			}
			st := obj.Type().Underlying().(*types.Struct)
			if got := sizes.Sizeof(st); got != int64(g.size) {
				t.Errorf("%s %s: size %d, want %d", arch, g.name, got, g.size)
			}
			vars := make([]*types.Var, st.NumFields())
			for i := range vars {
				vars[i] = st.Field(i)
			}
			offs := sizes.Offsetsof(vars)
			checkFields(t, arch+" "+g.name, g.fields, func(name string) (uintptr, bool) {
				for i, v := range vars {
					if v.Name() == name {
						return uintptr(offs[i]), true
					}
				}
				return 0, false
			})
		}
	}
}

func checkFields(t *testing.T, what string, fields []field, offset func(string) (uintptr, bool)) {
	t.Helper()
	for _, f := range fields {
		off, ok := offset(f.name)
		if !ok {
			t.Errorf("%s: no field %s", what, f.name)
		} else if off != f.off {
			t.Errorf("%s.%s: offset %d, want %d", what, f.name, off, f.off)
		}
	}
}

func hasField(fs []field, name string) bool {
	for _, f := range fs {
		if f.name == name {
			return true
		}
	}
	return false
}

// TestGoldenBytes encodes filled structs and compares them with the bytes
// the C structs hold (little-endian, as written by hand from nvos.h).
func TestGoldenBytes(t *testing.T) {
	tests := []struct {
		name string
		v    any
		hex  string
	}{
		{"NVOS00", NVOS00{0xC1D00001, 0x5C000001, 0x5C000003, 0x1F},
			"0100d0c1 0100005c 0300005c 1f000000"},
		{"NVOS21", NVOS21{0xC1D00001, 0x5C000001, 0x5C000003, 0xA06C, 0x7FFF12345678, 20, 0},
			"0100d0c1 0100005c 0300005c 6ca00000 78563412ff7f0000 14000000 00000000"},
		{"NVOS64", NVOS64{HRoot: 0xC1D00001, HObjectParent: 0x5C000001, HObjectNew: 0x5C000003, HClass: 0xA06C, PAllocParms: 0x1000, PRightsRequested: 0x2000, ParamsSize: 20, Flags: 3, Status: 0x56},
			"0100d0c1 0100005c 0300005c 6ca00000 0010000000000000 0020000000000000 14000000 03000000 56000000 00000000"},
		{"NVOS54", NVOS54{0xC1D00001, 0x5C000003, 0xA06C0103, 0, 0x1000, 8, 0x23},
			"0100d0c1 0300005c 0301 6ca0 00000000 0010000000000000 08000000 23000000"},
		{"XferCmd", XferCmd{0x2B, 32, 0x1000}, "2b000000 20000000 0010000000000000"},
		{"ChannelGroupAllocParams", ChannelGroupAllocParams{EngineType: 1, BIsCallingContextVgpuPlugin: 1},
			"00000000 00000000 00000000 01000000 01000000"},
		{"ScheduleParams", ScheduleParams{1, 0, 1}, "010001"},
		{"TimesliceParams", TimesliceParams{1024}, "0004000000000000"},
		{"PreemptParams", PreemptParams{BWait: 1, BManualTimeout: 1, TimeoutUs: 1_000_000}, "01010000 40420f00"},
		{"InterleaveParams", InterleaveParams{uint32(sched.InterleaveHigh)}, "02000000"},
		// A pre-535 NVOS21 has its status where 535 has paramsSize, and
		// padding where 535 has the status: read as a 535 block, a refused
		// allocation (0x1F) would pass for NV_OK.
		{"nvos21Pre535", nvos21Pre535{HRoot: 0xC1D00001, HObjectParent: 0x5C000001, HObjectNew: 0x5C000003, HClass: 0xA06C, PAllocParms: 0x1000, Status: 0x1F},
			"0100d0c1 0100005c 0300005c 6ca00000 0010000000000000 1f000000 00000000"},
		{"nvos64Pre535", nvos64Pre535{HRoot: 0xC1D00001, HObjectParent: 0x5C000001, HObjectNew: 0x5C000003, HClass: 0xA06C, PAllocParms: 0x1000, PRightsRequested: 0x2000, Flags: 3, Status: 0x56},
			"0100d0c1 0100005c 0300005c 6ca00000 0010000000000000 0020000000000000 03000000 56000000"},
	}
	for _, tc := range tests {
		var buf bytes.Buffer
		if err := binary.Write(&buf, binary.LittleEndian, tc.v); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want, err := hex.DecodeString(strings.ReplaceAll(tc.hex, " ", ""))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("%s:\n got % x\nwant % x", tc.name, buf.Bytes(), want)
		}
		// The in-memory layout equals the encoding (what the ioctl passes).
		p := reflect.New(reflect.TypeOf(tc.v))
		p.Elem().Set(reflect.ValueOf(tc.v))
		mem := unsafe.Slice((*byte)(p.UnsafePointer()), p.Elem().Type().Size())
		if !bytes.Equal(mem, want) {
			t.Errorf("%s in memory:\n got % x\nwant % x", tc.name, mem, want)
		}
	}
}

// TestRequestNumbers checks every request against the number NVRM.md
// gives and its bytes as the ioctl's cmd argument carries them.
func TestRequestNumbers(t *testing.T) {
	tests := []struct {
		name  string
		got   uint32
		esc   Escape
		size  uintptr
		want  uint32
		bytes string // little-endian
	}{
		{"RM_ALLOC NVOS21", ReqRMAlloc21, EscRMAlloc, unsafe.Sizeof(NVOS21{}), 0xC020462B, "2b4620c0"},
		{"RM_ALLOC NVOS64", ReqRMAlloc64, EscRMAlloc, unsafe.Sizeof(NVOS64{}), 0xC030462B, "2b4630c0"},
		{"RM_CONTROL", ReqRMControl, EscRMControl, unsafe.Sizeof(NVOS54{}), 0xC020462A, "2a4620c0"},
		{"RM_FREE", ReqRMFree, EscRMFree, unsafe.Sizeof(NVOS00{}), 0xC0104629, "294610c0"},
		{"IOCTL_XFER_CMD", ReqXferCmd, EscIoctlXferCmd, unsafe.Sizeof(XferCmd{}), 0xC01046D3, "d34610c0"},
		{"REGISTER_FD", ReqRegisterFD, EscRegisterFD, 4, 0xC00446C9, "c94604c0"},
		{"RM_ALLOC NVOS64 before 535.43.02", reqRMAlloc64Pre535, EscRMAlloc, unsafe.Sizeof(nvos64Pre535{}), 0xC028462B, "2b4628c0"},
	}
	for _, tc := range tests {
		r, err := Request(tc.esc, tc.size)
		if err != nil {
			t.Fatal(err)
		}
		if tc.got != tc.want || r != tc.want {
			t.Errorf("%s: constant %#x, Request %#x, want %#x", tc.name, tc.got, r, tc.want)
		}
		b := binary.LittleEndian.AppendUint32(nil, tc.got)
		if hex.EncodeToString(b) != tc.bytes {
			t.Errorf("%s: bytes %x, want %s", tc.name, b, tc.bytes)
		}
	}
	if _, err := Request(EscRMControl, 1<<14); err == nil {
		t.Error("Request accepted a size past the 14-bit field")
	}
}

// TestControlParamSizes checks the parameter size each control is issued
// with, per driver branch, against NVRM.md's table.
func TestControlParamSizes(t *testing.T) {
	l570, l575 := mustLayout(t, "570.86.15"), mustLayout(t, "575.51.03")
	tests := []struct {
		ctrl Control
		cmd  uint32
		size uintptr
	}{
		{CtrlGPFIFOSchedule, 0xA06C0101, uintptr(l575.ScheduleSize)},
		{CtrlSetTimeslice, 0xA06C0103, unsafe.Sizeof(TimesliceParams{})},
		{CtrlGetTimeslice, 0xA06C0104, unsafe.Sizeof(TimesliceParams{})},
		{CtrlPreempt, 0xA06C0105, unsafe.Sizeof(PreemptParams{})},
		{CtrlGetInfo, 0xA06C0106, unsafe.Sizeof(GetInfoParams{})},
		{CtrlSetInterleaveLevel, 0xA06C0107, unsafe.Sizeof(InterleaveParams{})},
		{CtrlGetInterleaveLevel, 0xA06C0108, unsafe.Sizeof(InterleaveParams{})},
		{CtrlFIFODisableChannels, 0x2080110B, unsafe.Sizeof(FIFODisableChannelsParams{})},
		{CtrlRunlistSetSchedPolicy, 0x20801115, unsafe.Sizeof(RunlistSchedPolicyParams{})},
	}
	want := map[uint32]uintptr{0xA06C0101: 3, 0xA06C0103: 8, 0xA06C0104: 8, 0xA06C0105: 8, 0xA06C0106: 4, 0xA06C0107: 4, 0xA06C0108: 4, 0x2080110B: 536, 0x20801115: 8}
	for _, tc := range tests {
		if uint32(tc.ctrl) != tc.cmd {
			t.Errorf("%s = %#x, want %#x", tc.ctrl, uint32(tc.ctrl), tc.cmd)
		}
		if tc.size != want[tc.cmd] {
			t.Errorf("%s: params %d bytes, want %d", tc.ctrl, tc.size, want[tc.cmd])
		}
	}
	if l570.ScheduleSize != 2 {
		t.Errorf("570: GPFIFO_SCHEDULE %d bytes, want 2", l570.ScheduleSize)
	}
}

func TestNames(t *testing.T) {
	tests := []struct{ got, want string }{
		{ClassChannelGroup.String(), "channel-group"},
		{ClassHopperGPFIFO.String(), "gpfifo-C86F"},
		{Class(0x1234).String(), "class-1234"},
		{ClassRootClient.String(), "client"},
		{EngineGraphics.String(), "graphics"},
		{EngineType(0x09).String(), "copy0"},
		{EngineType(0x12).String(), "copy9"},
		{EngineType(0x34).String(), "copy10"},
		{EngineType(0x3D).String(), "copy19"},
		{EngineNVDEC0.String(), "nvdec0"},
		{EngineType(0x99).String(), "engine-0x99"},
		{CtrlPreempt.String(), "PREEMPT"},
		{Control(0x1).String(), "control-0x00000001"},
		{sched.InterleaveHigh.String(), "high"},
		{ControlRdev.String(), "195:255"},
		{MkRdev(1, 7).String(), "1:7"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if !ClassHopperGPFIFO.IsChannel() || ClassChannelGroup.IsChannel() || !ClassRootNonPriv.IsClient() || ClassDevice.IsClient() {
		t.Error("class predicates")
	}
	for s, want := range map[string]sched.Interleave{"low": 0, "1": 1, "high": 2} {
		if l, err := sched.ParseInterleave(s); err != nil || l != want {
			t.Errorf("sched.ParseInterleave(%q) = %v, %v", s, l, err)
		}
	}
	if _, err := sched.ParseInterleave("max"); err == nil {
		t.Error("sched.ParseInterleave accepted max")
	}
}
