package nvrm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestParseDriverVersion(t *testing.T) {
	tests := []struct {
		in   string
		want DriverVersion
	}{
		{"570.86.15\n", DriverVersion{570, 86, 15}},
		{"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.51.03  Release Build  (dvs-builder@U22)  Wed May 7 2025\nGCC version:  gcc version 12.2.0\n", DriverVersion{575, 51, 3}},
		{"NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.43  Tue May 30 2023\n", DriverVersion{535, 43, 0}},
		{"610.05.01", DriverVersion{610, 5, 1}},
	}
	for _, tc := range tests {
		v, err := ParseDriverVersion(tc.in)
		if err != nil || v != tc.want {
			t.Errorf("%q: %v, %v; want %v", tc.in, v, err, tc.want)
		}
	}
	for _, bad := range []string{"", "NVRM version: unknown", "57.1"} {
		if _, err := ParseDriverVersion(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestLayoutFor(t *testing.T) {
	tests := []struct {
		v                       string
		schedule, chSize, chEng uint32
	}{
		{"535.43.02", 2, 304, 128},
		{"535.54.03", 2, 304, 128},
		{"535.86.10", 2, 360, 128},
		{"565.57.01", 2, 360, 128},
		{"570.86.15", 2, 368, 128},
		{"575.51.03", 3, 368, 128},
		{"595.10", 3, 368, 128},
		{"595.45.04", 3, 368, 128},
	}
	for _, tc := range tests {
		l := mustLayout(t, tc.v)
		if l.ScheduleSize != tc.schedule || l.ChannelAllocSize != tc.chSize || l.ChannelEngineOffset != tc.chEng || l.Unverified {
			t.Errorf("%s: %+v, want schedule %d, channel %d/%d", tc.v, l, tc.schedule, tc.chSize, tc.chEng)
		}
	}
}

// TestLayoutForRefusesOld checks that drivers before 535.43.02 are refused
// with a message that says why, for each version: their allocation blocks
// are the pre-535 ones of abi.go (TestLayoutHost checks those offsets).
func TestLayoutForRefusesOld(t *testing.T) {
	why := "Before 535.43.02 RM_ALLOC's blocks had no paramsSize: NVOS21's status is at byte 24 (not 28) and NVOS64 is 40 bytes " +
		"with its status at byte 36 (not 48 and 40; request 0xc028462b), so allocations would be dropped or their status read from padding; " +
		"the 525 and 530 branches are end-of-life: upgrade the driver"
	for _, v := range []string{"470.82.01", "520.61.05", "525.47.04", "525.147.05", "530.41.03", "535.43", "535.43.01"} {
		dv, err := ParseDriverVersion(v)
		if err != nil {
			t.Fatal(err)
		}
		_, err = LayoutFor(dv, &LayoutOptions{AllowUnverified: true})
		if !errors.Is(err, ErrUnsupportedDriver) || errors.Is(err, ErrUnverifiedDriver) {
			t.Fatalf("%s: %v, want ErrUnsupportedDriver", v, err)
		}
		want := "nvrm: driver " + dv.String() + ": driver not supported: Arbiter needs 535.43.02 or later. " + why
		if err.Error() != want {
			t.Errorf("%s:\n got %q\nwant %q", v, err, want)
		}
	}
}

// TestLayoutForUnverified checks that a driver newer than the newest
// verified tag is refused unless the caller accepts the risk, and then
// gets the newest verified branch's layouts, marked unverified.
func TestLayoutForUnverified(t *testing.T) {
	for _, v := range []string{"595.45.05", "595.58.03", "600.12", "610.05.01"} {
		dv, err := ParseDriverVersion(v)
		if err != nil {
			t.Fatal(err)
		}
		for _, opts := range []*LayoutOptions{nil, {}} {
			_, err = LayoutFor(dv, opts)
			if !errors.Is(err, ErrUnverifiedDriver) {
				t.Fatalf("%s: %v, want ErrUnverifiedDriver", v, err)
			}
			want := "nvrm: driver " + dv.String() + ": driver version not verified: the newest driver checked is 595.45.04 (the 595 branch); " +
				"refusing channel control rather than guessing its parameter layouts: use a driver up to 595.45.04, or accept the risk explicitly (LayoutOptions.AllowUnverified)"
			if err.Error() != want {
				t.Errorf("%s:\n got %q\nwant %q", v, err, want)
			}
		}
		l, err := LayoutFor(dv, &LayoutOptions{AllowUnverified: true})
		if err != nil || !l.Unverified || l.Version != dv || l.ScheduleSize != 3 || l.ChannelAllocSize != 368 || l.ChannelEngineOffset != 128 {
			t.Errorf("%s allowed: %+v, %v; want 595's layouts, unverified", v, l, err)
		}
	}
	if MinDriver() != (DriverVersion{535, 43, 2}) || NewestVerifiedDriver() != (DriverVersion{595, 45, 4}) {
		t.Errorf("range %s to %s", MinDriver(), NewestVerifiedDriver())
	}
}

func TestDetectLayout(t *testing.T) {
	root := t.TempDir()
	if _, err := DetectLayout(root, nil); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("no driver: %v", err)
	}
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(root+p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(root+p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(ProcVersionPath, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n")
	if l, err := DetectLayout(root, nil); err != nil || l.ScheduleSize != 2 || l.Version != (DriverVersion{570, 86, 15}) {
		t.Fatalf("proc: %+v, %v", l, err)
	}
	write(ModuleVersionPath, "580.65.06\n") // preferred
	if l, err := DetectLayout(root, nil); err != nil || l.ScheduleSize != 3 {
		t.Fatalf("module: %+v, %v", l, err)
	}
	write(ModuleVersionPath, "470.82.01\n")
	if _, err := DetectLayout(root, nil); !errors.Is(err, ErrUnsupportedDriver) {
		t.Fatalf("470: %v, want ErrUnsupportedDriver", err)
	}
	write(ModuleVersionPath, "610.05.01\n")
	if _, err := DetectLayout(root, nil); !errors.Is(err, ErrUnverifiedDriver) {
		t.Fatalf("610: %v, want ErrUnverifiedDriver", err)
	}
	if l, err := DetectLayout(root, &LayoutOptions{AllowUnverified: true}); err != nil || !l.Unverified {
		t.Fatalf("610 allowed: %+v, %v", l, err)
	}
}
