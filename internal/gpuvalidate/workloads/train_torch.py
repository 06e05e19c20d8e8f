"""train_torch: the best-effort PyTorch workload of the daemon section.

A training loop on the GPU: an MLP in bfloat16 with AdamW, forward,
backward and optimizer step on a fixed batch, synchronizing every
--sync-every steps as a loop that logs its loss would. It warms up (not
counted), prints "ready", then after each synchronize prints its progress
(Unix nanoseconds, steps done), so that its rate can be taken over another
workload's window, and at the end (its --duration, or SIGINT/SIGTERM) the
rate over its whole measured run:

    progress T_NS STEPS
    train: N steps in S s: R steps/s

Usage: python3 train_torch.py [--duration S] [--batch B] [--width W]
                              [--layers L] [--sync-every N]
Exit status 3: no torch; 4: torch without a usable GPU.
"""

import argparse
import signal
import sys
import time


class Stop(Exception):
    """Raised from the signal handlers to end the loop cleanly."""


def stop(signum, frame):
    raise Stop()


def main() -> int:
    p = argparse.ArgumentParser(description="best-effort PyTorch training loop")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to train after warming up")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--sync-every", type=int, default=2)
    a = p.parse_args()
    if a.duration <= 0 or a.sync_every <= 0:
        p.error("--duration and --sync-every must be positive")
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
    model = torch.nn.Sequential(*layers).to(dev, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(a.batch, a.width, device=dev, dtype=torch.bfloat16)
    target = torch.randn(a.batch, a.width, device=dev, dtype=torch.bfloat16)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    steps = 0
    start_ns = time.time_ns()
    print(f"progress {start_ns} 0", flush=True)
    end = time.monotonic() + a.duration
    try:
        while time.monotonic() < end:
            step()
            steps += 1
            if steps % a.sync_every == 0:
                torch.cuda.synchronize()
                print(f"progress {time.time_ns()} {steps}", flush=True)
    except Stop:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.cuda.synchronize()
    now = time.time_ns()
    print(f"progress {now} {steps}")
    secs = (now - start_ns) / 1e9
    print(f"train: {steps} steps in {secs:.2f} s: {steps / secs if secs > 0 else 0:.1f} steps/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
