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
		{"525.60.13", 2, 0, 128},
		{"535.43", 2, 304, 128},
		{"535.54.03", 2, 304, 128},
		{"535.86.10", 2, 360, 128},
		{"565.57.01", 2, 360, 128},
		{"570.86.15", 2, 368, 128},
		{"575.51.03", 3, 368, 128},
		{"595.10", 3, 368, 128},
		{"610.05.01", 3, 376, 136},
	}
	for _, tc := range tests {
		l := mustLayout(t, tc.v)
		if l.ScheduleSize != tc.schedule || l.ChannelAllocSize != tc.chSize || l.ChannelEngineOffset != tc.chEng {
			t.Errorf("%s: %+v, want schedule %d, channel %d/%d", tc.v, l, tc.schedule, tc.chSize, tc.chEng)
		}
	}
	for _, v := range []DriverVersion{{470, 82, 1}, {520, 61, 5}, {615, 1, 0}} {
		if _, err := LayoutFor(v); !errors.Is(err, ErrUnknownDriver) {
			t.Errorf("%s: %v, want ErrUnknownDriver", v, err)
		}
	}
}

func TestDetectLayout(t *testing.T) {
	root := t.TempDir()
	if _, err := DetectLayout(root); !errors.Is(err, ErrNoDriver) {
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
	if l, err := DetectLayout(root); err != nil || l.ScheduleSize != 2 || l.Version != (DriverVersion{570, 86, 15}) {
		t.Fatalf("proc: %+v, %v", l, err)
	}
	write(ModuleVersionPath, "580.65.06\n") // preferred
	if l, err := DetectLayout(root); err != nil || l.ScheduleSize != 3 {
		t.Fatalf("module: %+v, %v", l, err)
	}
	write(ModuleVersionPath, "470.82.01\n")
	if _, err := DetectLayout(root); !errors.Is(err, ErrUnknownDriver) {
		t.Fatalf("470: %v, want ErrUnknownDriver", err)
	}
}
