// Package rmstandin builds a stand-in for a CUDA process's driver calls: a
// C program that issues the NVIDIA Resource Manager ioctls of a CUDA
// context (client, device, subdevice, channel groups, a channel, CUDA's
// own timeslice and scheduling controls) on a stand-in control file, so
// that the tracer, registry and channel control can be tested end to end
// on a machine without a GPU; and a Driver that answers the controls
// Arbiter issues there as the NVIDIA driver would.
//
// The stand-in control file is a character device node for the kernel's
// /dev/full (1:7), created in a temporary directory. A node with the real
// control device's number (195:255) cannot be opened without the driver
// (ENXIO), and a regular file has no device number at all; /dev/full opens
// anywhere, answers every ioctl with ENOTTY, and is not a device any other
// program issues 'F' ioctls on. The tracer and controller take the device
// number to expect as an option, which tests set to StandinRdev.
package rmstandin

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
)

//go:embed c/rmstandin.c
var source []byte

// Major and Minor are the stand-in control file's device number (/dev/full).
const (
	Major = 1
	Minor = 7
)

// Handles the stand-in allocates (as in rmstandin.c).
const (
	Client        = 0xC1D00042
	Device0       = 0x5C000001
	Subdevice0    = 0x5C000002
	GroupGR       = 0x5C000003 // compute channel group on device 0 (NVOS64 form)
	Channel       = 0x5C000004 // HOPPER_CHANNEL_GPFIFO_A under GroupGR
	GroupCE       = 0x5C000005 // copy-engine group on device 0, via IOCTL_XFER_CMD
	Device1       = 0x5C000010
	GroupGR1      = 0x5C000011 // compute channel group on device 1
	CUDATimeslice = 2000       // the timeslice the stand-in sets itself, µs

	// Allocated with --channels only, after the rest: a channel in each
	// group and a subdevice for device 1, as FIFO_DISABLE_CHANNELS needs.
	ChannelCE  = 0x5C000006 // under GroupCE
	Subdevice1 = 0x5C000013 // under Device1
	ChannelGR1 = 0x5C000012 // under GroupGR1
)

// ChannelsFlag is the stand-in's argument that allocates the channels and
// subdevice above.
const ChannelsFlag = "--channels"

// Build compiles the stand-in program with gcc into dir and returns its path.
func Build(dir string) (string, error) {
	src := filepath.Join(dir, "rmstandin.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", fmt.Errorf("rmstandin: %w", err)
	}
	bin := filepath.Join(dir, "rmstandin")
	out, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-pthread", "-o", bin, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("rmstandin: gcc: %w\n%s", err, out)
	}
	return bin, nil
}

// MakeControlFile creates the stand-in control file (a character device
// node 1:7) named nvidiactl in dir and returns its path. It needs root
// (CAP_MKNOD).
func MakeControlFile(dir string) (string, error) {
	p := filepath.Join(dir, "nvidiactl")
	if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(Major, Minor))); err != nil {
		return "", fmt.Errorf("rmstandin: mknod %s char %d:%d: %w", p, Major, Minor, err)
	}
	return p, nil
}
