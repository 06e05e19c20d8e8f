package caps

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEffectiveFromStatus(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name    string
		status  string
		want    Set
		wantErr string
	}{
		{"root", "Name:\tx\nCapEff:\t000001ffffffffff\n", 0x1ffffffffff, ""},
		{"none", "CapEff:\t0000000000000000\n", 0, ""},
		{"bpf and perfmon", "CapEff:\t000000c000000000\n", 1<<BPF | 1<<Perfmon, ""},
		{"missing line", "Name:\tx\n", 0, "no CapEff"},
		{"garbage", "CapEff:\tzz\n", 0, "bad CapEff"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if err := os.WriteFile(p, []byte(tc.status), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := effectiveFrom(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %#x, %v; want %#x", got, err, tc.want)
			}
		})
	}
}

func TestMissing(t *testing.T) {
	if m := Missing(1<<SysAdmin, BPF, Perfmon); len(m) != 0 {
		t.Errorf("CAP_SYS_ADMIN should cover CAP_BPF and CAP_PERFMON, missing %v", m)
	}
	if m := Missing(1<<SysAdmin, SysNice); len(m) != 0 {
		t.Errorf("CAP_SYS_ADMIN should cover CAP_SYS_NICE, missing %v", m)
	}
	if m := Missing(1<<SysNice|1<<BPF, SysNice, Perfmon); len(m) != 1 || m[0] != Perfmon || SysNice.String() != "CAP_SYS_NICE" {
		t.Errorf("Missing = %v, want [CAP_PERFMON]", m)
	}
	m := Missing(1<<BPF, BPF, Perfmon, SysPtrace)
	if len(m) != 2 || m[0] != Perfmon || m[1] != SysPtrace {
		t.Errorf("Missing = %v, want [CAP_PERFMON CAP_SYS_PTRACE]", m)
	}
	if err := Check(^Set(0), "tracing", BPF, Perfmon, SysPtrace); err != nil {
		t.Errorf("full set: %v", err)
	}
	err := Check(1<<BPF, "tracing", BPF, Perfmon, SysPtrace)
	var me *MissingError
	if !errors.As(err, &me) || me.ExitCode() != 77 {
		t.Fatalf("Check = %v, want a *MissingError", err)
	}
	me.Binary = "/usr/bin/arbiter"
	want := "tracing needs CAP_PERFMON and CAP_SYS_PTRACE, which this process lacks: run it as root (sudo), " +
		"or grant the capabilities (setcap cap_perfmon,cap_sys_ptrace+ep /usr/bin/arbiter, or the container's securityContext.capabilities.add)"
	if err.Error() != want {
		t.Errorf("message\n got %q\nwant %q", err, want)
	}
	me.Hint = "or use --replay"
	if !strings.HasSuffix(err.Error(), "), or use --replay") {
		t.Errorf("hint not appended: %q", err)
	}
}
