package sim

import "github.com/gpu-arbiter/arbiter/trace"

// A GPU's two copy engines, host to device and device to host, serve
// copies first come, first served, apart from the compute engine.

// submitCopy queues p's head copy on its direction's copy engine.
func (g *gpu) submitCopy(p *proc, now uint64) {
	d := copyEngine(p.head().dir)
	if g.copyCur[d] != nil {
		g.copyQ[d] = append(g.copyQ[d], p)
		return
	}
	g.startCopy(d, p, now)
}

func (g *gpu) startCopy(d int, p *proc, now uint64) {
	g.copyCur[d] = p
	dur := p.head().dur
	g.st.CopyTime[d] += dur
	g.s.schedule(g.copySrc[d], now+dur)
}

// copyDone retires the copy on engine d and starts the next one queued.
func (g *gpu) copyDone(d int, now uint64) {
	p := g.copyCur[d]
	g.copyCur[d] = nil
	if len(g.copyQ[d]) > 0 {
		next := g.copyQ[d][0]
		g.copyQ[d] = g.copyQ[d][1:]
		g.startCopy(d, next, now)
	}
	p.st.Copies++
	g.s.popHead(p, now)
	if p.runnable() {
		g.kick(p, now)
	}
}

// copyEngine maps a direction to its engine: 0 host-to-device, 1
// device-to-host.
func copyEngine(d trace.CopyDir) int {
	if d == trace.CopyDtoH {
		return 1
	}
	return 0
}
