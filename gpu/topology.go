//go:build cgo

package gpu

import (
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Topology implements Inventory. NVLink peers come from the links' far
// ends: a link to another GPU's bus id makes that GPU a peer; links to the
// same NVSwitch (as on HGX boards) make every GPU on that switch a peer.
// The PCIe/system level of each pair comes from
// nvmlDeviceGetTopologyCommonAncestor.
func (n *NVML) Topology() (Topology, error) {
	unlock, err := n.enter()
	if err != nil {
		return Topology{}, err
	}
	defer unlock()
	var t Topology
	r := recorder{missing: n.missing, out: &t.Unsupported}
	bus := map[string]int{} // normalized PCI bus id -> GPU index
	for i, d := range n.devices {
		pci, ret := d.GetPciInfo()
		if ok, err := r.field(i, "pci_bus_id", "nvmlDeviceGetPciInfo", ret); err != nil {
			return Topology{}, err
		} else if ok {
			bus[busID(pci)] = i
		}
	}
	for i, d := range n.devices {
		links, err := n.nvlinks(r, i, d, bus)
		if err != nil {
			return Topology{}, err
		}
		t.GPUs = append(t.GPUs, GPULinks{GPU: i, NVLinks: links})
	}
	for a := range n.devices {
		for b := a + 1; b < len(n.devices); b++ {
			level, err := n.commonAncestor(r, a, b)
			if err != nil {
				return Topology{}, err
			}
			t.Pairs = append(t.Pairs, Pair{A: a, B: b, Level: level,
				NVLinks: min(linksTo(t.GPUs[a].NVLinks, t.GPUs[b].NVLinks, b), linksTo(t.GPUs[b].NVLinks, t.GPUs[a].NVLinks, a))})
		}
	}
	for i := range t.GPUs {
		for _, p := range t.Pairs {
			if p.NVLinks > 0 && (p.A == i || p.B == i) {
				t.GPUs[i].Peers = append(t.GPUs[i].Peers, p.A+p.B-i)
			}
		}
		slices.Sort(t.GPUs[i].Peers)
	}
	return t, nil
}

// nvlinks reads GPU i's active NVLinks. NVML answers NOT_SUPPORTED for a
// GPU without NVLink and INVALID_ARGUMENT past its last link.
func (n *NVML) nvlinks(r recorder, i int, d nvml.Device, bus map[string]int) ([]NVLink, error) {
	if !r.has(i, "nvlink", "nvmlDeviceGetNvLinkState") || !r.has(i, "nvlink", "nvmlDeviceGetNvLinkRemotePciInfo") {
		return nil, nil
	}
	var links []NVLink
	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := d.GetNvLinkState(link)
		if ret == nvml.ERROR_INVALID_ARGUMENT || (ret == nvml.ERROR_NOT_SUPPORTED && link > 0) {
			break
		}
		if ok, err := r.field(i, "nvlink", "nvmlDeviceGetNvLinkState", ret); err != nil {
			return nil, err
		} else if !ok {
			break
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := d.GetNvLinkRemotePciInfo(link)
		if ok, err := r.field(i, "nvlink_remote", "nvmlDeviceGetNvLinkRemotePciInfo", ret); err != nil {
			return nil, err
		} else if !ok {
			continue
		}
		remote := busID(pci)
		gpu, isGPU := bus[remote]
		if !isGPU {
			gpu = -1
		}
		links = append(links, NVLink{Link: link, RemoteBusID: remote, RemoteGPU: gpu})
	}
	return links, nil
}

// commonAncestor reads the PCIe/system level between GPUs a and b.
func (n *NVML) commonAncestor(r recorder, a, b int) (Level, error) {
	const call = "nvmlDeviceGetTopologyCommonAncestor"
	if !r.has(a, "topology", call) {
		return LevelUnknown, nil
	}
	level, ret := n.devices[a].GetTopologyCommonAncestor(n.devices[b])
	if ok, err := r.field(a, "topology", call, ret); err != nil || !ok {
		return LevelUnknown, err
	}
	switch level {
	case nvml.TOPOLOGY_INTERNAL:
		return LevelBoard, nil
	case nvml.TOPOLOGY_SINGLE:
		return LevelPIX, nil
	case nvml.TOPOLOGY_MULTIPLE:
		return LevelPXB, nil
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return LevelPHB, nil
	case nvml.TOPOLOGY_NODE:
		return LevelNODE, nil
	case nvml.TOPOLOGY_SYSTEM:
		return LevelSYS, nil
	}
	return LevelUnknown, nil
}

// linksTo counts the links in from that reach GPU to: directly, or through
// a switch that one of other's links (to's links) also reaches.
func linksTo(from, other []NVLink, to int) int {
	switches := map[string]bool{}
	for _, l := range other {
		if l.RemoteGPU < 0 {
			switches[l.RemoteBusID] = true
		}
	}
	count := 0
	for _, l := range from {
		if l.RemoteGPU == to || (l.RemoteGPU < 0 && switches[l.RemoteBusID]) {
			count++
		}
	}
	return count
}
