#!/usr/bin/env python3
"""Where a training step's GPU time goes, from a profiler's CSV (step T5 of scripts/gpu_first_run.sh).

Reads per-kernel times from either
  --nsys-kern CSV   `nsys stats --report cuda_gpu_kern_sum --format csv` (total time per kernel name)
  --ncu CSV         `ncu --csv --metrics gpu__time_duration.sum` (one row per kernel launch)
and optionally `--nsys-api CSV` (`nsys stats --report cuda_api_sum --format csv`) for the host
synchronisations. Kernels are classed by name:
  GEMM       cuBLAS/cuBLASLt/CUTLASS kernels: names with gemm, cublas, cutlass, nvjet (cuBLAS's
             Hopper kernels), xmma, splitK
  attention  names with attention (grass's kernels/cuda/attention.cu), sdpa, flash or fmha
             (cuDNN's fused attention; its SDPA engines' names are not yet seen on a GPU here),
             ahead of GEMM: an attention kernel may name its MMAs
  other      everything else (norms, RoPE, SwiGLU, cross-entropy, embedding, optimizer, ...)
and the GEMM kernels are listed with what their names say of the path (sm90/nvjet = Hopper
kernels; sm80/ampere = the older ones; alignN from CUTLASS names).

    profile_shares.py (--nsys-kern CSV | --ncu CSV) [--nsys-api CSV] [--steps N] [--layers L]
    profile_shares.py --self-test

Prints a table, the top 15 kernels (lines "TOP ..."), and a last line "SUMMARY: GEMM x%, attention
y%, other z% ..., optimizer w%" for the summary (the optimizer: AdamW, GRASS, low-rank, clip and
norm kernels by name).
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


def self_test():
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
    p.add_argument("--steps", type=int, default=1, help="training steps the profile covers")
    p.add_argument("--layers", type=int, default=24, help="transformer layers (attention per layer)")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args(argv)
    if a.self_test:
        return self_test()
    if bool(a.nsys_kern) == bool(a.ncu):
        p.error("give one of --nsys-kern and --ncu")
    if a.steps <= 0:
        p.error("--steps must be positive")
    with open(a.nsys_kern or a.ncu, errors="replace") as fh:
        text = fh.read()
    kernels = kernels_from_nsys(text) if a.nsys_kern else kernels_from_ncu(text)
    syncs = None
    if a.nsys_api:
        with open(a.nsys_api, errors="replace") as fh:
            syncs = syncs_from_nsys_api(fh.read())
    return report(kernels, a.steps, a.layers, syncs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
