#!/usr/bin/env python3
"""The host link weight streaming copies over (step T12 of scripts/gpu_first_run.sh; issue 47,
../shared/WEIGHT_STREAMING.md §6).

Times copies between pinned host memory and the GPU: host to device alone, device to host alone,
and both at once on two CUDA streams (what the engine's two copy queues do: PCIe is full duplex
when the GPU has two copy engines). CUDA events, --warmup untimed rounds, then --iters timed;
the median round. GB/s are 10^9 bytes a second each way, as `grass mem --link-gbps` takes them.

    python3 tools/gpu/link_probe.py [--mib 32,256] [--warmup 2] [--iters 10] [--json PATH]
                                    [--dry-run]

Prints one line per size, then `link: ...` (the largest size's three figures) for the lease
script. --dry-run checks the arguments and prints the plan without torch or a GPU. Exit status:
0 when it ran, 2 on bad arguments, 3 when torch or CUDA is missing.
"""
import argparse
import json
import statistics
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", default="32,256", help="copy sizes in MiB, comma-separated")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", default="")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    try:
        a.sizes = [int(x) for x in a.mib.split(",") if x.strip()]
    except ValueError:
        p.error("--mib: expected comma-separated integers, got %r" % a.mib)
    if not a.sizes or min(a.sizes) <= 0 or a.iters <= 0 or a.warmup < 0:
        p.error("sizes and --iters must be positive")
    return a


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def time_copies(torch, nbytes, warmup, iters):
    """Median milliseconds of: H2D alone, D2H alone, both at once (two streams, one each way)."""
    host_up = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host_down = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host_up.fill_(1)
    dev_up = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev_down = torch.full((nbytes,), 2, dtype=torch.uint8, device="cuda")
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def round_ms(h2d, d2h):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        cur = torch.cuda.current_stream()
        for stream, on in ((up, h2d), (down, d2h)):
            if not on:
                continue
            stream.wait_stream(cur)
            with torch.cuda.stream(stream):
                if stream is up:
                    dev_up.copy_(host_up, non_blocking=True)
                else:
                    host_down.copy_(dev_down, non_blocking=True)
            cur.wait_stream(stream)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    out = {}
    for name, h2d, d2h in (("h2d", True, False), ("d2h", False, True), ("both", True, True)):
        for _ in range(warmup):
            round_ms(h2d, d2h)
        out[name] = statistics.median(round_ms(h2d, d2h) for _ in range(iters))
    # the copies landed: a link that drops bytes is not a fast link
    if not (bool((dev_up == 1).all()) and bool((host_down == 2).all())):
        raise RuntimeError("a copy's destination does not hold its source")
    return out


def main(argv):
    a = parse_args(argv)
    if a.dry_run:
        print("link_probe: would time pinned copies of %s MiB each way alone and both at once, "
              "%d warm-ups, median of %d" % (",".join(map(str, a.sizes)), a.warmup, a.iters))
        return 0
    try:
        import torch
    except ImportError:
        print("link_probe: skipped (no torch)")
        return 3
    if not torch.cuda.is_available():
        print("link_probe: skipped (no CUDA)")
        return 3
    results = []
    for mib in a.sizes:
        nbytes = mib << 20
        ms = time_copies(torch, nbytes, a.warmup, a.iters)
        row = {"mib": mib, "h2d_gbps": gbps(nbytes, ms["h2d"]), "d2h_gbps": gbps(nbytes, ms["d2h"]),
               # both at once: each way's bytes over the round's time
               "both_gbps_each_way": gbps(nbytes, ms["both"])}
        results.append(row)
        print("%d MiB pinned: host to device %.1f GB/s, device to host %.1f GB/s, both at once "
              "%.1f GB/s each way" % (mib, row["h2d_gbps"], row["d2h_gbps"], row["both_gbps_each_way"]))
    last = results[-1]
    print("link: %d MiB H2D %.1f GB/s, D2H %.1f GB/s, both at once %.1f GB/s each way (%s)"
          % (last["mib"], last["h2d_gbps"], last["d2h_gbps"], last["both_gbps_each_way"],
             torch.cuda.get_device_name()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
