#!/usr/bin/env python3
"""Where a training step's GPU time goes, from a profiler's CSV (step T5 of scripts/gpu_first_run.sh).

Reads per-kernel times from either
  --nsys-kern CSV   `nsys stats --report cuda_gpu_kern_sum --format csv` (total time per kernel name)
  --ncu CSV         `ncu --csv --metrics gpu__time_duration.sum` (one row per kernel launch)
and optionally `--nsys-api CSV` (`nsys stats --report cuda_api_sum --format csv`) for the host
synchronisations. With `--nsys-trace CSV` (`nsys stats --report cuda_gpu_trace`: every kernel,
copy and memset with its start and duration) and `--nsys-nvtx CSV` (`nsys stats --report
nvtx_pushpop_trace`: the engine's NVTX ranges), it also says how long the GPU idles in each
training step: the "step" range's wall time against the union of the GPU's activity within it
(streams that overlap count once). Idle time is what launching each micro-batch as a CUDA graph
could win back (issue 45 item 5). Kernels are classed by name:
  GEMM       cuBLAS/cuBLASLt/CUTLASS kernels: names with gemm, cublas, cutlass, nvjet (cuBLAS's
             Hopper kernels), xmma, splitK
  attention  names with attention (grass's kernels/cuda/attention.cu), sdpa, flash or fmha
             (cuDNN's fused attention; its SDPA engines' names are not yet seen on a GPU here),
             ahead of GEMM: an attention kernel may name its MMAs
  other      everything else (norms, RoPE, SwiGLU, cross-entropy, embedding, optimizer, ...)
and the GEMM kernels are listed with what their names say of the path (sm90/nvjet = Hopper
kernels; sm80/ampere = the older ones; alignN from CUTLASS names).

    profile_shares.py (--nsys-kern CSV | --ncu CSV) [--nsys-api CSV] [--steps N] [--layers L]
                      [--nsys-trace CSV --nsys-nvtx CSV]
    profile_shares.py --nsys-trace CSV --nsys-nvtx CSV
    profile_shares.py --self-test

Prints a table, the top 15 kernels (lines "TOP ..."), and a line "SUMMARY: GEMM x%, attention
y%, other z% ..., optimizer w%" for the summary (the optimizer: AdamW, GRASS, low-rank, clip and
norm kernels by name); with the trace, a line "IDLE ..." per step and a last line "IDLE_SUMMARY:
the last step: wall ... ms, GPU busy ... ms, idle ... ms (p%) ...".
"""
import argparse
import csv
import io
import re
import sys
from collections import defaultdict

GEMM_RE = re.compile(r"gemm|cublas|cutlass|nvjet|xmma|splitk", re.I)
ATTN_RE = re.compile(r"attention|sdpa|flash|fmha", re.I)
# The optimizer's kernels (within "other"): AdamW, GRASS's and the low-rank updates, the norm and
# clipping, GRASS's slice norms; a step's share of them gives the MFU without the optimizer.
OPT_RE = re.compile(r"adam|clip|sum_squares|slice_norm|lowrank|flora|galore", re.I)
SYNC_RE = re.compile(r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|"
                     r"cudaMemcpy|cudaMemcpy2D|cudaMemset)(_v\d+)?$")
UNIT_NS = {"ns": 1, "nsecond": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
           "second": 1e9, "s": 1e9}


def category(name):
    if ATTN_RE.search(name):
        return "attention"
    if GEMM_RE.search(name):
        return "GEMM"
    return "other"


def gemm_path(name):
    tags = []
    low = name.lower()
    if "sm90" in low or "nvjet" in low:
        tags.append("sm90")
    if "sm80" in low or "ampere" in low:
        tags.append("sm80")
    m = re.search(r"align(\d+)", low)
    if m:
        tags.append("align" + m.group(1))
    if "splitk" in low:
        tags.append("split-K")
    return ",".join(tags) or "?"


def csv_rows(text, must_have):
    """The rows of the first CSV table in text whose header holds every column in must_have
    (profilers print other lines before and after their tables)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if all(col in line for col in must_have):
            reader = csv.DictReader(io.StringIO("\n".join(lines[i:])))
            rows = []
            for row in reader:
                if list(row.values()).count(None) >= len(row) - 1:
                    break  # a shorter line: the table has ended
                rows.append(row)
            return rows
    return []


def number(text):
    return float(str(text).replace(",", "").strip() or "nan")


def kernels_from_nsys(text):
    """name -> (total ns, instances)"""
    out = {}
    for row in csv_rows(text, ["Name", "Total Time"]):
        total_key = next(k for k in row if k and k.startswith("Total Time"))
        inst_key = next((k for k in row if k and k.startswith("Instances")), None)
        try:
            out[row["Name"]] = (number(row[total_key]), int(number(row[inst_key])) if inst_key else 1)
        except (ValueError, TypeError):
            continue
    return out


def kernels_from_ncu(text):
    """name -> (total ns, launches), from the details page (Metric Name/Value rows) or the raw
    page (one column per metric)."""
    out = defaultdict(lambda: [0.0, 0])
    rows = csv_rows(text, ["Kernel Name", "Metric Value"])
    if rows:
        for row in rows:
            if row.get("Metric Name") != "gpu__time_duration.sum":
                continue
            unit = UNIT_NS.get((row.get("Metric Unit") or "ns").strip(), 1)
            try:
                ns = number(row["Metric Value"]) * unit
            except ValueError:
                continue
            out[row["Kernel Name"]][0] += ns
            out[row["Kernel Name"]][1] += 1
    else:
        rows = csv_rows(text, ["Kernel Name", "gpu__time_duration.sum"])
        units = rows[0] if rows else {}
        for row in rows[1:]:  # the raw page's second row holds the units
            try:
                unit = UNIT_NS.get((units.get("gpu__time_duration.sum") or "ns").strip(), 1)
                ns = number(row["gpu__time_duration.sum"]) * unit
            except ValueError:
                continue
            out[row["Kernel Name"]][0] += ns
            out[row["Kernel Name"]][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def syncs_from_nsys_api(text):
    calls = {}
    for row in csv_rows(text, ["Name", "Num Calls"]):
        if SYNC_RE.match(row["Name"].strip()):
            calls[row["Name"].strip()] = int(number(row["Num Calls"]))
    return calls


def column(row, prefix):
    """(key, ns per unit) of the row's column whose name starts with prefix: "Start (ns)",
    "Duration (us)" and the like (nsys stats --timeunit changes the unit)."""
    key = next((k for k in row if k and k.strip().startswith(prefix)), None)
    if key is None:
        return None, 1
    m = re.search(r"\((\w+)\)", key)
    return key, UNIT_NS.get(m.group(1), 1) if m else 1


def intervals_from_nsys_trace(text):
    """[(start ns, end ns)] of every GPU activity (kernels, copies, memsets) in the trace."""
    out = []
    for row in csv_rows(text, ["Start", "Duration"]):
        start_key, start_unit = column(row, "Start")
        dur_key, dur_unit = column(row, "Duration")
        try:
            start = number(row[start_key]) * start_unit
            end = start + number(row[dur_key]) * dur_unit
        except (ValueError, TypeError):
            continue
        if end >= start:
            out.append((start, end))
    return out


def ranges_from_nsys_nvtx(text, name="step"):
    """[(start ns, end ns)] of the NVTX ranges called name (a domain prefix "d:name" too), in
    order."""
    out = []
    for row in csv_rows(text, ["Start", "End", "Name"]):
        label = (row.get("Name") or "").strip()
        if label != name and not label.endswith(":" + name):
            continue
        start_key, start_unit = column(row, "Start")
        end_key, end_unit = column(row, "End")
        try:
            out.append((number(row[start_key]) * start_unit, number(row[end_key]) * end_unit))
        except (ValueError, TypeError):
            continue
    return sorted(out)


def idle_in(window, activity, gap_ns=2000):
    """(busy ns, gaps) of the GPU within window = (start, end): busy is the length of the union of
    the activity clipped to it, gaps the idle stretches of at least gap_ns between its first and
    last activity (so launch gaps, not the stretch before the first kernel, which the host
    spends in the step's own set-up)."""
    lo, hi = window
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in activity if b > lo and a < hi)
    busy, gaps, cover_end = 0.0, [], None
    for a, b in clipped:
        if cover_end is None or a > cover_end:
            if cover_end is not None and a - cover_end >= gap_ns:
                gaps.append(a - cover_end)
            busy += b - a
            cover_end = b
        elif b > cover_end:
            busy += b - cover_end
            cover_end = b
    return busy, gaps


def report_idle(steps, activity, out=sys.stdout):
    if not steps:
        print("IDLE_SUMMARY: no \"step\" NVTX ranges in the profile", file=out)
        return 1
    for i, window in enumerate(steps):
        wall = window[1] - window[0]
        busy, gaps = idle_in(window, activity)
        idle = wall - busy
        print("IDLE step %d: wall %.2f ms, GPU busy %.2f ms, idle %.2f ms (%.1f%%); gaps of 2 us or "
              "more between kernels: %d, %.2f ms in all, the largest %.3f ms"
              % (i + 1, wall / 1e6, busy / 1e6, idle / 1e6, 100 * idle / wall if wall else 0,
                 len(gaps), sum(gaps) / 1e6, max(gaps, default=0) / 1e6), file=out)
    wall = steps[-1][1] - steps[-1][0]
    busy, gaps = idle_in(steps[-1], activity)
    print("IDLE_SUMMARY: the last step: wall %.2f ms, GPU busy %.2f ms, idle %.2f ms (%.1f%%), "
          "%.2f ms of it between kernels (gaps: %d)"
          % (wall / 1e6, busy / 1e6, (wall - busy) / 1e6, 100 * (wall - busy) / wall if wall else 0,
             sum(gaps) / 1e6, len(gaps)), file=out)
    return 0


def report(kernels, steps, layers, syncs=None, out=sys.stdout):
    total = sum(ns for ns, _ in kernels.values())
    if total <= 0:
        print("profile_shares: no kernel times found", file=out)
        print("SUMMARY: no kernel times in the profile", file=out)
        return 1
    by_cat = defaultdict(float)
    launches = defaultdict(int)
    for name, (ns, n) in kernels.items():
        by_cat[category(name)] += ns
        launches[category(name)] += n
    print("| class | GPU time per step (ms) | share | launches per step |", file=out)
    print("|---|---|---|---|", file=out)
    for cat in ("GEMM", "attention", "other"):
        print("| %s | %.2f | %.1f%% | %.0f |" % (cat, by_cat[cat] / 1e6 / steps,
                                               100 * by_cat[cat] / total, launches[cat] / steps), file=out)
    print("| all kernels | %.2f | 100%% | %.0f |" % (total / 1e6 / steps, sum(launches.values()) / steps),
          file=out)
    print(file=out)
    print("GEMM kernels (by time):", file=out)
    gemms = sorted(((ns, n, name) for name, (ns, n) in kernels.items() if category(name) == "GEMM"),
                   reverse=True)
    for ns, n, name in gemms[:12]:
        print("  %5.1f%%  %6d x  [%s]  %s" % (100 * ns / total, n, gemm_path(name), name[:150]), file=out)
    print("Top other kernels:", file=out)
    others = sorted(((ns, n, name) for name, (ns, n) in kernels.items() if category(name) != "GEMM"),
                    reverse=True)
    for ns, n, name in others[:10]:
        print("  %5.1f%%  %6d x  %s" % (100 * ns / total, n, name[:150]), file=out)
    print("Top 15 kernels (all classes):", file=out)
    for ns, n, name in sorted(((ns, n, name) for name, (ns, n) in kernels.items()), reverse=True)[:15]:
        print("TOP  %5.1f%%  %8.3f ms/step  %6d x  %s" % (100 * ns / total, ns / 1e6 / steps, n,
                                                          name[:150]), file=out)
    optimizer = sum(ns for name, (ns, _) in kernels.items() if OPT_RE.search(name))
    sm90 = sum(ns for ns, _, name in gemms if "sm90" in gemm_path(name))
    sync_txt = ""
    if syncs:
        print("Host synchronisations (whole run): " +
              ", ".join("%s %d" % kv for kv in sorted(syncs.items())), file=out)
        sync_txt = ", %.0f sync calls per step" % (sum(syncs.values()) / steps)
    attn_layer = by_cat["attention"] / 1e6 / steps / layers if layers else 0
    print("SUMMARY: GEMM %.1f%%, attention %.1f%%, other %.1f%% of %.1f ms GPU time per step; "
          "%.0f%% of GEMM time in sm90/nvjet kernels; attention %.3f ms per layer; "
          "optimizer %.1f%%%s"
          % (100 * by_cat["GEMM"] / total, 100 * by_cat["attention"] / total,
             100 * by_cat["other"] / total, total / 1e6 / steps,
             100 * sm90 / by_cat["GEMM"] if by_cat["GEMM"] else 0, attn_layer,
             100 * optimizer / total, sync_txt), file=out)
    return 0


SELF_TEST_NSYS = """Processing [t5.sqlite] with [cuda_gpu_kern_sum.py]...

"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
60.0,"6,000,000",300,20000.0,20000.0,1,1,0.0,"nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTT"
10.0,1000000,100,10000.0,10000.0,1,1,0.0,"sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_align2"
20.0,2000000,48,1.0,1.0,1,1,0.0,"void grass::cuda::attention_backward_dkdv_kernel<64, 64>(...)"
5.0,500000,500,1.0,1.0,1,1,0.0,"void grass::cuda::rmsnorm_forward_kernel(...)"
5.0,500000,10,1.0,1.0,1,1,0.0,"void grass::cuda::adamw_kernel<float>(...)"
"""
SELF_TEST_API = """"Time (%)","Total Time (ns)","Num Calls","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
50.0,100,30,1,1,1,1,0,"cudaStreamSynchronize"
10.0,100,6,1,1,1,1,0,"cudaLaunchKernel"
"""
SELF_TEST_NCU = """==PROF== Connected to process 1 (grass)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","grass","h","nvjet_tst_256x128","1","7","(384, 1, 1)","(66, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","3,000.00"
"1","1","grass","h","attention_forward_kernel","1","7","(256, 1, 1)","(4, 32, 16)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","1.00"
"2","1","grass","h","swiglu_forward_kernel","1","7","(256, 1, 1)","(100, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1000000"
"""


# Two steps (nanoseconds): in the first (0.5-5.0 ms), a 1 ms kernel, a 0.5 ms gap, two
# overlapping kernels on two streams (2.5-3.5 and 3.0-4.0 ms: 1.5 ms of union), a 0.5 ms gap and a
# copy running past the step's end; in the second, in microseconds, a kernel that starts before
# it, and a 1 us gap (under 2 us).
SELF_TEST_TRACE = """Processing [t5.sqlite] with [cuda_gpu_trace.py]...

"Start (ns)","Duration (ns)","CorrId","GrdX","GrdY","GrdZ","BlkX","BlkY","BlkZ","Reg/Trd","StcSMem (MB)","DymSMem (MB)","Bytes (MB)","Throughput (MBps)","SrcMemKd","DstMemKd","Device","Ctx","GreenCtx","Strm","Name"
1000000,1000000,1,1,1,1,1,1,1,1,0,0,,,,,"0","1",,"7","k1"
2500000,1000000,2,1,1,1,1,1,1,1,0,0,,,,,"0","1",,"7","k2"
3000000,1000000,3,1,1,1,1,1,1,1,0,0,,,,,"0","1",,"8","k3"
4500000,1000000,4,,,,,,,,,,1.0,1.0,"Pinned","Device","0","1",,"9","[CUDA memcpy Host-to-Device]"
"""
SELF_TEST_TRACE_US = """"Start (us)","Duration (us)","CorrId","Name"
9500,1000,5,"k4"
10501,499,6,"k5"
"""
SELF_TEST_NVTX = """"Start (ns)","End (ns)","Duration (ns)","DurChild (ns)","DurNonChild (ns)","Name","PID","TID","Lvl","NumChild","RangeId","ParentId","RangeStack","NameTree"
500000,5000000,4500000,0,0,"step",1,1,0,2,1,,":1",":step"
600000,900000,300000,0,0,"forward",1,1,1,0,2,1,":1:2",":step:forward"
10000000,11000000,1000000,0,0,"step",1,1,0,0,3,,":3",":step"
"""


def self_test():
    out = io.StringIO()
    activity = intervals_from_nsys_trace(SELF_TEST_TRACE) + \
        intervals_from_nsys_trace(SELF_TEST_TRACE_US)
    assert len(activity) == 6 and activity[-1] == (10501000, 11000000), activity
    steps = ranges_from_nsys_nvtx(SELF_TEST_NVTX)
    assert steps == [(500000, 5000000), (10000000, 11000000)], steps
    busy, gaps = idle_in(steps[0], activity)
    assert busy == 1000000 + 1500000 + 500000 and gaps == [500000, 500000], (busy, gaps)
    busy, gaps = idle_in(steps[1], activity)
    assert busy == 500000 + 499000 and gaps == [], (busy, gaps)
    assert report_idle(steps, activity, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == ("IDLE step 1: wall 4.50 ms, GPU busy 3.00 ms, idle 1.50 ms (33.3%); gaps of 2 "
                        "us or more between kernels: 2, 1.00 ms in all, the largest 0.500 ms"), lines[0]
    assert lines[-1] == ("IDLE_SUMMARY: the last step: wall 1.00 ms, GPU busy 1.00 ms, "
                         "idle 0.00 ms (0.1%), 0.00 ms of it between kernels (gaps: 0)"), lines[-1]
    out = io.StringIO()
    k = kernels_from_nsys(SELF_TEST_NSYS)
    assert len(k) == 5 and k["nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTT"] == (6e6, 300), k
    s = syncs_from_nsys_api(SELF_TEST_API)
    assert s == {"cudaStreamSynchronize": 30}, s
    assert report(k, steps=3, layers=2, syncs=s, out=out) == 0
    last = out.getvalue().strip().splitlines()[-1]
    assert "GEMM 70.0%, attention 20.0%, other 10.0% of 3.3 ms" in last, last
    assert "86% of GEMM time in sm90" in last and "10 sync calls per step" in last, last
    assert "0.333 ms per layer" in last and "optimizer 5.0%" in last, last
    tops = [line for line in out.getvalue().splitlines() if line.startswith("TOP ")]
    assert len(tops) == 5 and "nvjet" in tops[0] and "60.0%" in tops[0], tops
    assert gemm_path("sm80_xmma_gemm_bf16_align2") == "sm80,align2"
    k = kernels_from_ncu(SELF_TEST_NCU)
    assert k == {"nvjet_tst_256x128": (3e6, 1), "attention_forward_kernel": (1e6, 1),
                 "swiglu_forward_kernel": (1e6, 1)}, k
    out = io.StringIO()
    assert report(k, steps=1, layers=1, out=out) == 0
    assert "GEMM 60.0%, attention 20.0%, other 20.0%" in out.getvalue(), out.getvalue()
    # cuDNN's attention kernels, in the forms its engines' names take (generated SDPA kernels,
    # flash and fmha ones, some naming their MMAs), are attention; the GEMMs stay GEMM
    for name in ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0",
                 "sm90_flash_bprop_wgmma_bf16_knob_3", "fmha_cutlass_fwd_bf16_sm90",
                 "void grass::cuda::attention_forward_kernel<64>(...)"):
        assert category(name) == "attention", name
    for name in ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "sm90_xmma_gemm_bf16bf16_bf16f32",
                 "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8"):
        assert category(name) == "GEMM", name
    assert category("void grass::cuda::rope_kernel(...)") == "other"
    print("profile_shares: self-test passed")
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nsys-kern")
    p.add_argument("--nsys-api")
    p.add_argument("--ncu")
    p.add_argument("--nsys-trace", help="nsys stats --report cuda_gpu_trace --format csv")
    p.add_argument("--nsys-nvtx", help="nsys stats --report nvtx_pushpop_trace --format csv")
    p.add_argument("--steps", type=int, default=1, help="training steps the profile covers")
    p.add_argument("--layers", type=int, default=24, help="transformer layers (attention per layer)")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args(argv)
    if a.self_test:
        return self_test()
    if bool(a.nsys_trace) != bool(a.nsys_nvtx):
        p.error("--nsys-trace and --nsys-nvtx go together")
    if a.nsys_kern and a.ncu:
        p.error("give one of --nsys-kern and --ncu")
    if not (a.nsys_kern or a.ncu or a.nsys_trace):
        p.error("give --nsys-kern or --ncu, or --nsys-trace with --nsys-nvtx")
    if a.steps <= 0:
        p.error("--steps must be positive")
    rc = 0
    if a.nsys_kern or a.ncu:
        with open(a.nsys_kern or a.ncu, errors="replace") as fh:
            text = fh.read()
        kernels = kernels_from_nsys(text) if a.nsys_kern else kernels_from_ncu(text)
        syncs = None
        if a.nsys_api:
            with open(a.nsys_api, errors="replace") as fh:
                syncs = syncs_from_nsys_api(fh.read())
        rc = report(kernels, a.steps, a.layers, syncs)
    if a.nsys_trace:
        with open(a.nsys_trace, errors="replace") as fh:
            activity = intervals_from_nsys_trace(fh.read())
        with open(a.nsys_nvtx, errors="replace") as fh:
            steps = ranges_from_nsys_nvtx(fh.read())
        rc = report_idle(steps, activity) or rc
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
