//go:build !cgo

package gpu

// Open reports NVML unavailable: go-nvml loads NVML through cgo, and this
// binary was built without it.
func Open(opts *Options) (Inventory, error) {
	return nil, &UnavailableError{
		Reason: "this arbiter binary was built without cgo (CGO_ENABLED=0), and NVML can only be loaded through cgo",
		Fix:    "run a build made with cgo (make build CGO=1); see docs/architecture.md, \"NVML and cgo\"",
	}
}
