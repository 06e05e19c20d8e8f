//go:build cgo

package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// returnName names an NVML return code. It does not ask NVML
// (nvmlErrorString), so it is safe after a failed Init.
func returnName(ret nvml.Return) string {
	if name, ok := returnNames[ret]; ok {
		return name
	}
	return fmt.Sprintf("NVML error %d", int(ret))
}

// returnHint says what usually causes an NVML return code and what to do.
func returnHint(ret nvml.Return) string {
	return returnHints[ret]
}

var returnNames = map[nvml.Return]string{
	nvml.SUCCESS:                         "SUCCESS",
	nvml.ERROR_UNINITIALIZED:             "ERROR_UNINITIALIZED",
	nvml.ERROR_INVALID_ARGUMENT:          "ERROR_INVALID_ARGUMENT",
	nvml.ERROR_NOT_SUPPORTED:             "ERROR_NOT_SUPPORTED",
	nvml.ERROR_NO_PERMISSION:             "ERROR_NO_PERMISSION",
	nvml.ERROR_ALREADY_INITIALIZED:       "ERROR_ALREADY_INITIALIZED",
	nvml.ERROR_NOT_FOUND:                 "ERROR_NOT_FOUND",
	nvml.ERROR_INSUFFICIENT_SIZE:         "ERROR_INSUFFICIENT_SIZE",
	nvml.ERROR_INSUFFICIENT_POWER:        "ERROR_INSUFFICIENT_POWER",
	nvml.ERROR_DRIVER_NOT_LOADED:         "ERROR_DRIVER_NOT_LOADED",
	nvml.ERROR_TIMEOUT:                   "ERROR_TIMEOUT",
	nvml.ERROR_IRQ_ISSUE:                 "ERROR_IRQ_ISSUE",
	nvml.ERROR_LIBRARY_NOT_FOUND:         "ERROR_LIBRARY_NOT_FOUND",
	nvml.ERROR_FUNCTION_NOT_FOUND:        "ERROR_FUNCTION_NOT_FOUND",
	nvml.ERROR_CORRUPTED_INFOROM:         "ERROR_CORRUPTED_INFOROM",
	nvml.ERROR_GPU_IS_LOST:               "ERROR_GPU_IS_LOST",
	nvml.ERROR_RESET_REQUIRED:            "ERROR_RESET_REQUIRED",
	nvml.ERROR_OPERATING_SYSTEM:          "ERROR_OPERATING_SYSTEM",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH:   "ERROR_LIB_RM_VERSION_MISMATCH",
	nvml.ERROR_IN_USE:                    "ERROR_IN_USE",
	nvml.ERROR_MEMORY:                    "ERROR_MEMORY",
	nvml.ERROR_NO_DATA:                   "ERROR_NO_DATA",
	nvml.ERROR_INSUFFICIENT_RESOURCES:    "ERROR_INSUFFICIENT_RESOURCES",
	nvml.ERROR_ARGUMENT_VERSION_MISMATCH: "ERROR_ARGUMENT_VERSION_MISMATCH",
	nvml.ERROR_NOT_READY:                 "ERROR_NOT_READY",
	nvml.ERROR_GPU_NOT_FOUND:             "ERROR_GPU_NOT_FOUND",
	nvml.ERROR_INVALID_STATE:             "ERROR_INVALID_STATE",
	nvml.ERROR_UNKNOWN:                   "ERROR_UNKNOWN",
}

var returnHints = map[nvml.Return]string{
	nvml.ERROR_NO_PERMISSION:           "run arbiter as root, or give it access to /dev/nvidiactl and /dev/nvidia*",
	nvml.ERROR_DRIVER_NOT_LOADED:       "the NVIDIA kernel module is not loaded: load it (modprobe nvidia) and check dmesg",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH: "libnvidia-ml and the loaded kernel module are different driver versions: reboot, or reload the nvidia modules, after a driver upgrade",
	nvml.ERROR_GPU_IS_LOST:             "the GPU fell off the bus: look for Xid 79 in dmesg and reset the GPU or the node",
	nvml.ERROR_RESET_REQUIRED:          "the GPU needs a reset (nvidia-smi -r) before it can be used",
	nvml.ERROR_TIMEOUT:                 "the driver did not answer in time: check dmesg for Xid errors",
	nvml.ERROR_IRQ_ISSUE:               "the kernel reports interrupt trouble with the GPU: check dmesg",
	nvml.ERROR_CORRUPTED_INFOROM:       "the GPU's infoROM is corrupted: see the GPU's vendor",
	nvml.ERROR_GPU_NOT_FOUND:           "the GPU is gone: it was removed or reset while arbiter ran",
	nvml.ERROR_INSUFFICIENT_POWER:      "check the GPU's power cables",
}
