package preflight

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/gpu"
	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// noDriverFix is what to do where no NVIDIA driver is loaded.
const noDriverFix = "install the NVIDIA driver and load its kernel module (modprobe nvidia; nvidia-smi should list the GPUs); " +
	"in a container, mount the host's root and pass --root, or mount /proc/driver/nvidia and /dev/nvidia*"

// checkLibcuda lists the libcuda copies the tracer would attach now, in
// library directories and in running processes (inside containers too),
// with the driver version each one's name carries.
func checkLibcuda(e *env) result {
	opts := &uprobe.Options{ProcRoot: e.path("/proc")}
	if e.root != "/" {
		// The linker cache names paths of the other root, which would be
		// looked up here; its directories are searched instead.
		opts.LdCache = "-"
		for _, d := range uprobe.DefaultSearchDirs() {
			opts.SearchDirs = append(opts.SearchDirs, e.path(d))
		}
	}
	libs, err := uprobe.Discover(opts)
	if err != nil {
		return result{Warn, "discover libcuda: " + err.Error(), "make the library directories and /proc readable"}
	}
	// Reading another user's /proc/PID/maps takes ptrace read access.
	unseen := ""
	if !e.holds(caps.SysPtrace) {
		unseen = " (other users' processes unseen: reading their mappings needs CAP_SYS_PTRACE)"
	}
	if len(libs) == 0 {
		return result{Warn, "no libcuda found in the linker cache, the library directories or any process's mappings" + unseen + ": nothing to trace yet (arbiter attaches copies as they appear)",
			"install the NVIDIA driver's user-space libraries; in a pod, run with hostPID: true (or mount the host's /proc and pass --root) so that CUDA processes in other containers are seen"}
	}
	driver, derr := driverVersion(e)
	var parts, mismatched []string
	for _, l := range libs {
		v := l.Version
		if v == "" {
			v = "version not in its name"
		} else if derr == nil && !sameVersion(v, driver) {
			mismatched = append(mismatched, l.Path)
		}
		parts = append(parts, fmt.Sprintf("%s (%s; %s)", l.Path, v, l.Source))
	}
	detail := fmt.Sprintf("%d found: %s%s", len(libs), strings.Join(parts, ", "), unseen)
	// A CUDA toolkit's forward-compatibility copy (cuda/compat) is used
	// only by processes whose library path names it: no fault of the node.
	var compat []string
	mismatched = slices.DeleteFunc(mismatched, func(p string) bool {
		if forwardCompat(p) {
			compat = append(compat, p)
			return true
		}
		return false
	})
	if len(compat) > 0 {
		detail += fmt.Sprintf("; %s: a CUDA forward-compatibility copy, used only by processes whose library path names it", strings.Join(compat, ", "))
	}
	if len(mismatched) > 0 {
		return result{Warn, fmt.Sprintf("%s; the loaded driver is %s, and CUDA fails to initialize with a libcuda of another version unless it is a forward-compatibility package: %s",
			detail, driver, strings.Join(mismatched, ", ")),
			"install the user-space libraries of the loaded driver's version (in containers: the NVIDIA container toolkit mounts the host's)"}
	}
	return result{OK, detail, ""}
}

// forwardCompat reports whether path is in a CUDA toolkit's
// forward-compatibility directory (/usr/local/cuda-12.4/compat/, ...).
func forwardCompat(path string) bool {
	dir := filepath.Dir(path)
	return filepath.Base(dir) == "compat" && strings.HasPrefix(filepath.Base(filepath.Dir(dir)), "cuda")
}

// sameVersion reports whether a library's version names the driver
// version v ("550.54.15" and 550.54.15; minor and patch compared as
// numbers).
func sameVersion(lib string, v nvrm.DriverVersion) bool {
	lv, err := nvrm.ParseDriverVersion(lib)
	return err == nil && lv == v
}

// checkNVML loads NVML as the GPU inventory does (gpu.Check: loaded,
// initialized, versions and GPUs read, closed), for the GPUs and topology
// the policies see, through Options.OpenNVML where one is given. Under
// another root it loads that root's libnvidia-ml.so.1, found in the
// standard library directories.
func checkNVML(e *env) result {
	opts := &gpu.Options{}
	if e.root != "/" {
		var searched []string
		for _, d := range uprobe.DefaultSearchDirs() {
			p := filepath.Join(e.path(d), gpu.DefaultLibrary)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				opts.LibraryPath = p
				break
			}
			searched = append(searched, d)
		}
		if opts.LibraryPath == "" {
			return result{Warn, fmt.Sprintf("%s not found under %s in %s: policies see no GPU inventory or topology", gpu.DefaultLibrary, e.root, strings.Join(searched, ", ")),
				"install the NVIDIA driver's NVML library (it ships with the driver); in a container, include utility in NVIDIA_DRIVER_CAPABILITIES"}
		}
	}
	a := gpu.Check(e.openNVML, opts)
	if !a.OK {
		return result{Warn, a.Detail, a.Fix}
	}
	detail := "NVML works: " + a.Detail
	if opts.LibraryPath != "" {
		detail += " (" + opts.LibraryPath + ")"
	}
	return result{OK, detail, ""}
}

// checkDriver checks the loaded driver's version against channel
// control's version gate (nvrm.DetectLayout): drivers older than
// nvrm.MinDriver() are refused, and newer than nvrm.NewestVerifiedDriver()
// unless --allow-unverified-driver accepts them.
func checkDriver(e *env) result {
	verified := fmt.Sprintf("layouts verified from %s to %s", nvrm.MinDriver(), nvrm.NewestVerifiedDriver())
	l, err := nvrm.DetectLayout(e.root, &nvrm.LayoutOptions{AllowUnverified: e.allowUnverified})
	if err == nil {
		if l.Unverified {
			return result{Warn, fmt.Sprintf("%s: newer than %s, accepted by --allow-unverified-driver: channel control assumes the %d branch's layouts (%s)",
				l.Version, nvrm.NewestVerifiedDriver(), nvrm.NewestVerifiedDriver().Major, verified),
				fmt.Sprintf("prefer a driver up to %s; watch channel controls for NV_ERR_INVALID_ARGUMENT, the sign of a changed layout", nvrm.NewestVerifiedDriver())}
		}
		return result{OK, fmt.Sprintf("%s: channel control supported (%s)", l.Version, verified), ""}
	}
	v, verr := driverVersion(e)
	switch {
	case errors.Is(err, nvrm.ErrNoDriver):
		return result{Fail, fmt.Sprintf("no NVIDIA driver loaded: neither %s nor %s exists", e.path(nvrm.ModuleVersionPath), e.path(nvrm.ProcVersionPath)), noDriverFix}
	case verr != nil:
		return result{Fail, err.Error(), "check that the nvidia kernel module is loaded and its version file readable (cat /proc/driver/nvidia/version)"}
	case errors.Is(err, nvrm.ErrUnsupportedDriver):
		return result{Fail, fmt.Sprintf("%s: refused, older than %s, the oldest whose parameter layouts channel control knows", v, nvrm.MinDriver()),
			fmt.Sprintf("upgrade the driver to %s or later (the 525 and 530 branches are end-of-life)", nvrm.MinDriver())}
	case errors.Is(err, nvrm.ErrUnverifiedDriver):
		return result{Fail, fmt.Sprintf("%s: refused, newer than %s, the newest whose parameter layouts were verified", v, nvrm.NewestVerifiedDriver()),
			fmt.Sprintf("use a driver up to %s, or accept the risk: run arbiter (and doctor) with --allow-unverified-driver", nvrm.NewestVerifiedDriver())}
	}
	return result{Fail, err.Error(), "check the driver's version file (cat /proc/driver/nvidia/version)"}
}

// driverVersion reads the loaded driver's version as nvrm.DetectLayout
// does.
func driverVersion(e *env) (nvrm.DriverVersion, error) {
	var firstErr error
	for _, p := range []string{nvrm.ModuleVersionPath, nvrm.ProcVersionPath} {
		b, err := os.ReadFile(e.path(p))
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		return nvrm.ParseDriverVersion(string(b))
	}
	return nvrm.DriverVersion{}, firstErr
}

// checkControlDevices checks the driver's device nodes: the control
// device channel control opens its sessions through, and one node per
// GPU.
func checkControlDevices(e *env) result {
	ctl := e.path(nvrm.ControlPath)
	var st unix.Stat_t
	if err := unix.Stat(ctl, &st); err != nil {
		return result{Fail, fmt.Sprintf("%s: %v", ctl, err),
			"load the driver and create its device nodes (nvidia-modprobe -c 0 -u, or mknod -m 666 /dev/nvidiactl c 195 255); in a container, add the host's /dev/nvidiactl and /dev/nvidia* as devices"}
	}
	rdev := nvrm.MkRdev(unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || rdev != nvrm.ControlRdev {
		return result{Fail, fmt.Sprintf("%s is not the control device, character device 195:255 (mode %#o, device %d:%d)", ctl, st.Mode&unix.S_IFMT, unix.Major(st.Rdev), unix.Minor(st.Rdev)),
			"remove it and let the driver create it (nvidia-modprobe -c 0 -u), or mknod -m 666 /dev/nvidiactl c 195 255"}
	}
	access := "readable and writable"
	if err := unix.Access(ctl, unix.R_OK|unix.W_OK); err != nil {
		access = "not readable and writable by this process (arbiter uses the processes' own open files, so it does not need to)"
	}
	gpus := gpuNodes(e.path("/dev"))
	if len(gpus) == 0 {
		return result{Warn, fmt.Sprintf("%s is the control device (195:255), %s, but there is no /dev/nvidiaN: no GPU device node", ctl, access),
			"create the GPUs' nodes (nvidia-modprobe -c N for each GPU N); in a container, add the host's /dev/nvidia0... as devices"}
	}
	return result{OK, fmt.Sprintf("%s is the control device (195:255), %s; %d GPU nodes: %s", ctl, access, len(gpus), strings.Join(gpus, ", ")), ""}
}

// gpuNodes lists the /dev/nvidiaN character devices in dev, by N.
func gpuNodes(dev string) []string {
	var out []string
	for _, n := range nvrm.GPUDevices(dev) {
		out = append(out, "/dev/nvidia"+strconv.Itoa(n))
	}
	return out
}

// checkClientValidation reads the driver's client validation: under the
// non-strict mode a root daemon cannot control another user's process.
func checkClientValidation(e *env) result {
	cv, err := nvrm.DetectClientValidation(e.root)
	switch {
	case errors.Is(err, nvrm.ErrNoDriver):
		return result{Fail, fmt.Sprintf("cannot tell: %s does not exist (no NVIDIA driver loaded)", e.path(nvrm.ParamsPath)), noDriverFix}
	case err != nil:
		return result{Fail, err.Error(), "make " + nvrm.ParamsPath + " readable (it is world-readable where the driver is loaded)"}
	}
	fix := fmt.Sprintf("remove %s from the nvidia module's NVreg_RegistryDwords (modprobe.d options or the kernel command line) and reload the module", nvrm.ClientValidationKey)
	switch cv.Mode {
	case nvrm.ValidationStrict:
		return result{OK, fmt.Sprintf("strict (%s): channel control works on any user's process", cv), ""}
	case nvrm.ValidationNonStrict:
		return result{Warn, fmt.Sprintf("non-strict (%s): channel control works only on processes of arbiter's own effective user", cv), fix}
	}
	return result{Warn, fmt.Sprintf("%s (%s): channel control works, and so would any process's calls on any other process's driver client", cv.Mode, cv), fix}
}
