package nvrm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/trace"
)

// paramsFile is /proc/driver/nvidia/params as the driver prints it
// (nv_procfs_read_params), with the two registry strings given.
func paramsFile(dwords, perDevice string) string {
	return "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n" +
		"RegistryDwords: \"" + dwords + "\"\nRegistryDwordsPerDevice: \"" + perDevice + "\"\nRmMsg: \"\"\nGpuBlacklist: \"\"\nTemporaryFilePath: \"\"\nExcludedGpus: \"\"\n"
}

func TestParseClientValidation(t *testing.T) {
	tests := []struct {
		name, dwords, perDevice string
		mode                    ValidationMode
		desc                    string
	}{
		{"default", "", "", ValidationStrict, "driver default"},
		{"other keys", "RMForceEnableGen2=1;PeerMappingOverride=1", "", ValidationStrict, "driver default"},
		{"strict off", "RmValidateClientData=0x80", "", ValidationNonStrict, "NVreg_RegistryDwords sets RmValidateClientData=0x80"},
		{"decimal, case, spaces", "PeerMappingOverride=1; rmvalidateclientdata = 128 ;", "", ValidationNonStrict, "NVreg_RegistryDwords sets RmValidateClientData=0x80"},
		{"octal", "RmValidateClientData=0200", "", ValidationNonStrict, "NVreg_RegistryDwords sets RmValidateClientData=0x80"},
		{"strict on", "RmValidateClientData=0x40", "", ValidationStrict, "NVreg_RegistryDwords sets RmValidateClientData=0x40"},
		{"handle off", "RmValidateClientData=0x20", "", ValidationOff, "NVreg_RegistryDwords sets RmValidateClientData=0x20"},
		{"all off", "RmValidateClientData=2", "", ValidationOff, "NVreg_RegistryDwords sets RmValidateClientData=0x2"},
		{"every field off", "RmValidateClientData=0xAA", "", ValidationOff, "NVreg_RegistryDwords sets RmValidateClientData=0xaa"},
		{"all on overrides", "RmValidateClientData=0x81", "", ValidationStrict, "NVreg_RegistryDwords sets RmValidateClientData=0x81"},
		{"later wins", "RmValidateClientData=0x80;RmValidateClientData=0x40", "", ValidationStrict,
			"NVreg_RegistryDwords sets RmValidateClientData=0x80, NVreg_RegistryDwords sets RmValidateClientData=0x40"},
		{"no value", "RmValidateClientData;RmValidateClientData=", "", ValidationStrict, "driver default"},
		{"two =", "RmValidateClientData=0x80=1", "", ValidationStrict, "driver default"},
		{"per device", "", "pci=0000:3b:00.0;RmValidateClientData=0x80", ValidationNonStrict,
			"NVreg_RegistryDwordsPerDevice (pci=0000:3b:00.0) sets RmValidateClientData=0x80"},
		{"per device before any pci", "", "RmValidateClientData=0x80;pci=3b:00;Foo=1", ValidationStrict, "driver default"},
		{"per device after global", "RmValidateClientData=0x80", "pci=0000:3b:00.0;RmValidateClientData=0x40", ValidationStrict,
			"NVreg_RegistryDwords sets RmValidateClientData=0x80, NVreg_RegistryDwordsPerDevice (pci=0000:3b:00.0) sets RmValidateClientData=0x40"},
	}
	for _, tc := range tests {
		cv := ParseClientValidation(paramsFile(tc.dwords, tc.perDevice))
		if cv.Mode != tc.mode || cv.String() != tc.desc {
			t.Errorf("%s: %s, %q; want %s, %q", tc.name, cv.Mode, cv, tc.mode, tc.desc)
		}
	}
	for s, want := range map[string]uint32{"0x80": 0x80, "0X1f": 0x1f, "128": 128, "0200": 0o200, "0": 0, "0x": 0, "12abc": 12, "x1": 0, "99999999999": 0x4876e7ff, "999999999999999999999": 0xFFFFFFFF} {
		if got := strtoul(s); got != want {
			t.Errorf("strtoul(%q) = %#x, want %#x", s, got, want)
		}
	}
}

func TestDetectClientValidation(t *testing.T) {
	root := t.TempDir()
	if _, err := DetectClientValidation(root); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("no driver: %v", err)
	}
	writeParams(t, root, paramsFile("RmValidateClientData=0x80", ""))
	cv, err := DetectClientValidation(root)
	if err != nil || cv.Mode != ValidationNonStrict {
		t.Fatalf("%+v, %v", cv, err)
	}
}

func writeParams(t *testing.T, root, text string) {
	t.Helper()
	p := filepath.Join(root, ParamsPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestInvalidClientExplained controls a stand-in process of another user
// (uid 65534) whose every control the driver refuses with
// NV_ERR_INVALID_CLIENT: under non-strict client validation the error
// names the registry key and how to fix it; under strict validation, or
// for a process of this process's own euid, it says something else.
func TestInvalidClientExplained(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to run a process as another user")
	}
	// A directory another user can reach, with the stand-in and a control
	// file it can open.
	dir, err := os.MkdirTemp("", "nvrm-client")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := rmstandin.Build(dir)
	if err != nil {
		testenv.Skip(t, "cannot build the stand-in (gcc): %v", err)
	}
	ctl, err := rmstandin.MakeControlFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ctl, 0o666); err != nil {
		t.Fatal(err)
	}
	drv := rmstandin.NewDriver(true)
	drv.Refuse(0, 0, rmstandin.StatusInvalidClient)
	root := t.TempDir()
	for _, tc := range []struct {
		name      string
		uid       uint32
		dwords    string
		nonStrict bool
		want      string
	}{
		{"other user, non-strict", 65534, "RmValidateClientData=0x80", true,
			"(euid 65534) refused to this process (euid 0): the driver's client validation is not strict: NVreg_RegistryDwords sets RmValidateClientData=0x80 (strict client validation disabled), " +
				"under which the driver checks the caller's euid or pid against the client's instead of the open file; remove RmValidateClientData from the nvidia module's NVreg_RegistryDwords"},
		{"other user, strict", 65534, "", false, "client validation is strict: the client no longer lives on the file the process holds at that descriptor"},
		{"same user, non-strict", 0, "RmValidateClientData=0x80", false, "driver returned NV_ERR_INVALID_CLIENT (0x23)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeParams(t, root, paramsFile(tc.dwords, ""))
			pid, fd := startStandinAs(t, bin, ctl, tc.uid)
			reg, err := NewRegistry(nil)
			if err != nil {
				t.Fatal(err)
			}
			applyAll(reg, []trace.Event{
				evAlloc(pid, fd, rmstandin.Client, 0, rmstandin.Client, ClassRootClient, 0, 0),
				evAlloc(pid, fd, rmstandin.Client, rmstandin.Client, rmstandin.Device0, ClassDevice, 0, 0),
				evAlloc(pid, fd, rmstandin.Client, rmstandin.Device0, rmstandin.GroupGR, ClassChannelGroup, EngineGraphics, 0),
			})
			c, err := NewController(reg, &ControllerOptions{Layout: mustLayout(t, "575.51.03"), ControlRdev: standinRdev,
				AcceptErrno: unix.ENOTTY, Respond: drv.Answer, DriverRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for name, err := range map[string]error{
				"timeslice": c.SetTimeslice(pid, -1, 100),
				"suspend":   c.Suspend(pid, -1),
				"resume":    c.Resume(pid, -1),
			} {
				if !errors.Is(err, ErrInvalidClient) || errors.Is(err, ErrNonStrictClientValidation) != tc.nonStrict || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: %v\nwant ErrInvalidClient, non-strict %v, and %q", name, err, tc.nonStrict, tc.want)
				}
			}
		})
	}
}

// startStandinAs runs the stand-in as uid (and gid) and returns its pid
// and control descriptor.
func startStandinAs(t *testing.T, bin, ctl string, uid uint32) (uint32, int32) {
	t.Helper()
	cmd := exec.Command(bin, ctl)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	s := startStandinCmd(t, cmd)
	return s.pid, s.ctlFD
}
