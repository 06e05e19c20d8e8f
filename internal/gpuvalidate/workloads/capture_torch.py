"""capture_torch: the PyTorch workload scripts/gpu-validate.sh captures.

A small MLP's inference on the GPU, one request at a time: copy the input
in, forward, copy the output out, synchronize. PyTorch makes driver calls of
its own (cuBLAS, the caching allocator), so the counts it prints are lower
bounds, in the form the capture check reads:

    calls: launches>=N copies>=N syncs>=N

and the requests' latency in the stub workloads' form:

    infer: N requests in S s: p50 X us, p99 Y us, max Z us

Usage: python3 capture_torch.py [REQUESTS]
Exit status 3: no torch; 4: torch without a usable GPU.
"""

import sys
import time


def main() -> int:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    try:
        import torch
    except ImportError as e:
        print(f"torch: not importable: {e}", flush=True)
        return 3
    if not torch.cuda.is_available():
        print(f"torch: {torch.__version__} sees no usable GPU (built for CUDA {torch.version.cuda})", flush=True)
        return 4
    dev = torch.device("cuda")
    print(f"torch: {torch.__version__} CUDA {torch.version.cuda} on {torch.cuda.get_device_name(dev)}", flush=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 1024),
    ).to(dev).eval()
    x = torch.randn(64, 1024)
    latencies = []
    start = time.monotonic()
    with torch.inference_mode():
        for _ in range(requests):
            t0 = time.monotonic()
            y = model(x.to(dev))
            out = y.cpu()
            torch.cuda.synchronize()
            latencies.append((time.monotonic() - t0) * 1e6)
    secs = time.monotonic() - start
    if float(out.abs().sum()) == 0.0:
        print("wrong: the model's output is all zero", flush=True)
        return 1
    latencies.sort()

    def at(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    # Each request: a copy in and one out, at least one kernel launch, and
    # torch.cuda.synchronize (cuCtxSynchronize).
    print(f"calls: launches>={requests} copies>={2 * requests} htod>={requests} dtoh>={requests} syncs>={requests}", flush=True)
    print(
        f"infer: {requests} requests in {secs:.2f} s: p50 {at(0.5):.0f} us, p99 {at(0.99):.0f} us, max {latencies[-1]:.0f} us",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
