package nvrm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/gpu-arbiter/arbiter/procfs"
)

// The driver checks, on every call, that the caller may use the RM client
// the call names (rmclientValidate). By default the check is "strict": the
// client must have been created on the very open file the call arrives on,
// which is why Arbiter works through a duplicate of the process's own
// control file. The registry key RmValidateClientData can change that, and
// one setting breaks channel control: strict validation off with handle
// validation on ("non-strict"), where the driver compares the caller's
// euid and pid with the client's creator's instead, so a root daemon may
// not use another user's client even through that user's file.

// ClientValidationKey is the driver registry key that sets client
// validation, in NVreg_RegistryDwords or NVreg_RegistryDwordsPerDevice.
const ClientValidationKey = "RmValidateClientData"

// ParamsPath is where the loaded driver shows its module parameters,
// NVreg_RegistryDwords among them. (/sys/module/nvidia/parameters does not
// show the string parameters: the module exports them with mode 0.)
const ParamsPath = "/proc/driver/nvidia/params"

// ErrNonStrictClientValidation is returned with NV_ERR_INVALID_CLIENT
// where the driver runs with non-strict client validation and the target
// process belongs to another user than the caller.
var ErrNonStrictClientValidation = errors.New("the driver's client validation is not strict")

// ValidationMode is how the driver checks a call's client.
type ValidationMode uint8

// Client validation modes.
const (
	// ValidationStrict, the default: the client must have been created
	// on the open file the call arrives on. Channel control works.
	ValidationStrict ValidationMode = iota
	// ValidationNonStrict: the caller's euid or pid must equal the
	// client creator's. Channel control works only on processes of the
	// caller's own euid; a root daemon's control of another user's
	// process fails with NV_ERR_INVALID_CLIENT.
	ValidationNonStrict
	// ValidationOff: no check (handle validation disabled). Channel
	// control works, and so would any process's calls on any client.
	ValidationOff
)

// String returns "strict", "non-strict" or "off".
func (m ValidationMode) String() string {
	switch m {
	case ValidationStrict:
		return "strict"
	case ValidationNonStrict:
		return "non-strict"
	case ValidationOff:
		return "off"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ClientValidation is the loaded driver's client validation, as its
// registry settings give it.
type ClientValidation struct {
	Mode ValidationMode
	// Settings are the RmValidateClientData values found, in the order
	// applied; none where the driver's defaults apply.
	Settings []ValidationSetting
}

// ValidationSetting is one RmValidateClientData value and where it was
// set.
type ValidationSetting struct {
	Value uint32
	// Source is "NVreg_RegistryDwords", or
	// "NVreg_RegistryDwordsPerDevice (pci=...)".
	Source string
}

// String describes the settings, e.g. "NVreg_RegistryDwords sets
// RmValidateClientData=0x80", or "driver default".
func (cv ClientValidation) String() string {
	if len(cv.Settings) == 0 {
		return "driver default"
	}
	parts := make([]string, len(cv.Settings))
	for i, s := range cv.Settings {
		parts[i] = fmt.Sprintf("%s sets %s=%#x", s.Source, ClientValidationKey, s.Value)
	}
	return strings.Join(parts, ", ")
}

// DetectClientValidation reads the loaded driver's client validation from
// ParamsPath under root ("/" outside tests). It returns an error wrapping
// ErrNoDriver where the file does not exist.
func DetectClientValidation(root string) (ClientValidation, error) {
	if root == "" {
		root = "/"
	}
	b, err := os.ReadFile(strings.TrimSuffix(root, "/") + ParamsPath)
	if errors.Is(err, os.ErrNotExist) {
		return ClientValidation{}, fmt.Errorf("nvrm: %w: %s does not exist (is the nvidia kernel module loaded?)", ErrNoDriver, ParamsPath)
	}
	if err != nil {
		return ClientValidation{}, fmt.Errorf("nvrm: read driver parameters: %w", err)
	}
	return ParseClientValidation(string(b)), nil
}

// ParseClientValidation reads the client validation from the text of
// ParamsPath: its RegistryDwords and RegistryDwordsPerDevice lines, parsed
// as the driver does (whitespace ignored, "key=value" pairs separated by
// ';', keys without regard to case, values as C's strtoul with base 0).
// Per-device values apply after the global one, in the order listed: the
// driver applies each GPU's value as it initializes that GPU, over what
// the previous GPU left.
func ParseClientValidation(params string) ClientValidation {
	var cv ClientValidation
	sc := bufio.NewScanner(strings.NewReader(params))
	var perDevice string
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		value = strings.Trim(strings.TrimSpace(value), `"`)
		switch strings.TrimSpace(name) {
		case "RegistryDwords":
			for _, kv := range registryPairs(value) {
				if strings.EqualFold(kv[0], ClientValidationKey) {
					cv.Settings = append(cv.Settings, ValidationSetting{Value: strtoul(kv[1]), Source: "NVreg_RegistryDwords"})
				}
			}
		case "RegistryDwordsPerDevice":
			perDevice = value
		}
	}
	pci := ""
	for _, kv := range registryPairs(perDevice) {
		switch {
		case kv[0] == "pci":
			pci = kv[1]
		case pci != "" && strings.EqualFold(kv[0], ClientValidationKey):
			cv.Settings = append(cv.Settings, ValidationSetting{Value: strtoul(kv[1]), Source: "NVreg_RegistryDwordsPerDevice (pci=" + pci + ")"})
		}
	}
	handle, strict := true, true
	for _, s := range cv.Settings {
		handle, strict = applyValidation(s.Value, handle, strict)
	}
	switch {
	case !handle:
		cv.Mode = ValidationOff
	case !strict:
		cv.Mode = ValidationNonStrict
	}
	return cv
}

// applyValidation applies an RmValidateClientData value to the driver's
// handle and strict properties as sysInitRegistryOverrides does: each
// 2-bit field is 0 (leave as is), 1 (enable) or 2 (disable); bits 5:4 are
// handle validation, 7:6 strict validation, and 1:0 all of them, applied
// last.
func applyValidation(v uint32, handle, strict bool) (bool, bool) {
	set := func(field uint32, cur bool) bool {
		switch (v >> field) & 3 {
		case 1:
			return true
		case 2:
			return false
		}
		return cur
	}
	handle = set(4, handle)
	strict = set(6, strict)
	handle = set(0, handle)
	strict = set(0, strict)
	return handle, strict
}

// registryPairs splits a RegistryDwords string into its key=value pairs as
// the driver does: whitespace removed, pairs separated by ';', pairs
// without exactly one '=' or with an empty side skipped.
func registryPairs(s string) [][2]string {
	s = strings.Join(strings.Fields(s), "")
	var out [][2]string
	for tok := range strings.SplitSeq(s, ";") {
		k, v, ok := strings.Cut(tok, "=")
		if !ok || k == "" || v == "" || strings.Contains(v, "=") {
			continue
		}
		out = append(out, [2]string{k, v})
	}
	return out
}

// strtoul parses the longest number at the start of s as C's strtoul with
// base 0 does (0x: hex, 0: octal, else decimal), truncated to 32 bits as
// the driver stores it; 0 where there is none.
func strtoul(s string) uint32 {
	base := 10
	switch {
	case len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && isDigit(s[2], 16):
		base, s = 16, s[2:]
	case len(s) > 1 && s[0] == '0':
		base = 8
	}
	n := 0
	for n < len(s) && isDigit(s[n], base) {
		n++
	}
	v, err := strconv.ParseUint(s[:n], base, 64)
	if err != nil && n > 0 {
		v = ^uint64(0) // out of range: ULONG_MAX
	}
	return uint32(v)
}

func isDigit(c byte, base int) bool {
	switch {
	case c >= '0' && c <= '9':
		return int(c-'0') < base
	case base == 16 && (c|0x20) >= 'a' && (c|0x20) <= 'f':
		return true
	}
	return false
}

// explainInvalidClient says why an operation on pid got
// NV_ERR_INVALID_CLIENT, where the driver shows it: under non-strict
// client validation, a process of another euid than this one is refused
// even through its own file; under strict validation, the descriptor no
// longer holds the file the client was created on.
func (c *Controller) explainInvalidClient(pid uint32, err error) error {
	if err == nil || !errors.Is(err, ErrInvalidClient) {
		return err
	}
	cv, verr := DetectClientValidation(c.opts.DriverRoot)
	if verr != nil {
		return err
	}
	switch cv.Mode {
	case ValidationNonStrict:
		them, uerr := processEUID(pid)
		me := uint32(os.Geteuid())
		if uerr != nil || them == me {
			return err
		}
		return fmt.Errorf("nvrm: process %d (euid %d) refused to this process (euid %d): %w: %s (strict client validation disabled), "+
			"under which the driver checks the caller's euid or pid against the client's instead of the open file; "+
			"remove %s from the nvidia module's NVreg_RegistryDwords (modprobe.d options or kernel command line) and reload the module, "+
			"or control the process as its own user\n%w", pid, them, me, ErrNonStrictClientValidation, cv, ClientValidationKey, err)
	case ValidationStrict:
		return fmt.Errorf("%w\n(client validation is strict: the client no longer lives on the file the process holds at that descriptor; "+
			"it was freed, or the process closed its control file and opened the control device again on the same descriptor)", err)
	}
	return err
}

// processEUID returns pid's effective uid, from /proc/PID/status.
func processEUID(pid uint32) (uint32, error) {
	_, euid, err := procfs.At("/proc").UID(int(pid))
	return euid, err
}
