"""serve_torch: the latency-critical PyTorch workload of the daemon section.

An inference service's loop on the GPU: requests arrive at a Poisson rate,
and each copies its input in, runs an MLP forward pass in half precision,
copies the output out and synchronizes its stream. It warms up first (not
measured), prints "ready", then measures for --duration seconds and prints
the wall-clock window it measured (Unix nanoseconds) and the requests'
latency, each from the request's start to its synchronize's return:

    window START_NS END_NS
    infer: N requests in S s: p50 X us, p99 Y us, max Z us

Usage: python3 serve_torch.py [--rate R] [--duration S] [--warmup S]
                              [--batch B] [--width W] [--layers L]
Exit status 3: no torch; 4: torch without a usable GPU.
"""

import argparse
import random
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description="latency-critical PyTorch inference loop")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second (Poisson arrivals)")
    p.add_argument("--duration", type=float, default=15.0, help="seconds measured")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of requests before measuring")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    a = p.parse_args()
    if a.rate <= 0 or a.duration <= 0:
        p.error("--rate and --duration must be positive")
    try:
        import torch
    except ImportError as e:
        print(f"torch: not importable: {e}", flush=True)
        return 3
    if not torch.cuda.is_available():
        print(f"torch: {torch.__version__} sees no usable GPU (built for CUDA {torch.version.cuda})", flush=True)
        return 4
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev, dtype=torch.float16).eval()
    x_host = torch.randn(a.batch, a.width, dtype=torch.float16).pin_memory()
    y_host = torch.empty(a.batch, a.width, dtype=torch.float16).pin_memory()
    stream = torch.cuda.current_stream()

    def request() -> None:
        with torch.inference_mode():
            x = x_host.to(dev, non_blocking=True)
            y_host.copy_(model(x), non_blocking=True)
        stream.synchronize()

    end = time.monotonic() + a.warmup
    while time.monotonic() < end:
        request()
        time.sleep(1.0 / a.rate)
    print("ready", flush=True)

    rng = random.Random(1)
    lat = []
    start_ns = time.time_ns()
    start = time.monotonic()
    end = start + a.duration
    arrival = start
    while True:
        arrival += rng.expovariate(a.rate)
        if arrival >= end:
            break
        now = time.monotonic()
        if arrival > now:
            time.sleep(arrival - now)
        t0 = time.perf_counter_ns()
        request()
        lat.append((time.perf_counter_ns() - t0) / 1000.0)
    end_ns = time.time_ns()
    secs = (end_ns - start_ns) / 1e9
    print(f"window {start_ns} {end_ns}")
    if not lat:
        print(f"infer: 0 requests in {secs:.2f} s", flush=True)
        return 0
    lat.sort()

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    print(f"infer: {len(lat)} requests in {secs:.2f} s: p50 {pct(0.50):.0f} us, p99 {pct(0.99):.0f} us, max {lat[-1]:.0f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
