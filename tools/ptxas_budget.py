#!/usr/bin/env python3
"""The kernels' register, spill, stack, shared-memory and launch-bound budget on sm_90.

Register pressure decides occupancy, and a spill turns a kernel's inner loop into local-memory
traffic; neither shows in a test's numbers, and the emulator cannot see them. An edit that pushed
attention's dQ kernel from 100 to 116 registers went unnoticed (issue 25). This compiles every
kernels/cuda/*.cu for sm_90 with `ptxas -v`, as the build does, and compares each kernel with
tools/ptxas_budget.json: more registers, spills, stack or static shared memory than recorded, a
kernel not recorded, or a recorded one gone, fails with one line each. Fewer passes with a note.
A kernel's launch bound (`__launch_bounds__`: the PTX's .maxntid, as max_threads; 0 for none)
must equal the recorded one. The CUDA emulator reads the registers, the static shared memory and
the bound from the budget, and refuses a launch a GPU would refuse for them.

  tools/ptxas_budget.py [--nvcc PATH] [--jobs N]     check (exit 77: no nvcc, or another version)
  tools/ptxas_budget.py --record                     rewrite the budget after a deliberate change
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = os.path.join(ROOT, "tools", "ptxas_budget.json")
ARCH = "sm_90"
ENTRY = re.compile(r"Compiling entry function '([^']+)' for '" + ARCH + "'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")
# a PTX entry, its parameters, then its directives up to the body: .maxntid X[, Y[, Z]]
PTX_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\([^)]*\)([^{]*)\{")
MAXNTID = re.compile(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


def nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def launch_bounds(ptx):
    """{mangled kernel name: the threads its .maxntid allows a block (0: no bound)}."""
    bounds = {}
    for m in PTX_ENTRY.finditer(ptx):
        n = MAXNTID.search(m.group(2))
        bounds[m.group(1)] = 0 if not n else int(n.group(1)) * int(n.group(2) or 1) * int(n.group(3) or 1)
    return bounds


def compile_usage(nvcc, source):
    """{mangled kernel name: {registers, smem, stack, spill_stores, spill_loads, max_threads}} of
    one file (the PTX kept from the same compile gives the launch bounds)."""
    with tempfile.TemporaryDirectory() as keep:
        cmd = [nvcc, "-DGRASS_HAVE_CUDA=1", "-I" + ROOT, "-O3", "-DNDEBUG", "-arch=" + ARCH,
               "-std=c++17", "-Xptxas", "-v", "-keep", "-keep-dir", keep, "-x", "cu", "-c", source,
               "-o", os.devnull]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{os.path.relpath(source, ROOT)} does not compile:\n{run.stderr}")
        bounds = {}
        for f in os.listdir(keep):
            if f.endswith(".ptx"):
                with open(os.path.join(keep, f)) as ptx:
                    bounds.update(launch_bounds(ptx.read()))
    usage, name = {}, None
    for line in run.stderr.splitlines():
        if m := ENTRY.search(line):
            name = m.group(1)
            usage[name] = {"registers": 0, "smem": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0,
                           "max_threads": bounds.get(name, 0)}
        elif name and (m := FRAME.search(line)):
            usage[name].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                               spill_loads=int(m.group(3)))
        elif name and (m := USED.search(line)):
            usage[name].update(registers=int(m.group(1)), smem=int(m.group(2) or 0))
    return usage


def demangle(names):
    """Readable, path-independent keys: the anonymous namespace's hash names the file's path."""
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return [re.sub(r"\(anonymous namespace\)::", "", n) for n in out.splitlines()]


def measure(nvcc, jobs):
    sources = sorted(os.path.join(ROOT, "kernels", "cuda", f)
                     for f in os.listdir(os.path.join(ROOT, "kernels", "cuda")) if f.endswith(".cu"))
    kernels = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for source, usage in zip(sources, pool.map(lambda s: compile_usage(nvcc, s), sources)):
            file = os.path.relpath(source, ROOT)
            for key, value in zip(demangle(list(usage)), usage.values()):
                kernels[f"{file}: {key}"] = value
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if not os.access(args.nvcc, os.X_OK):
        print(f"ptxas budget: skipped (no nvcc at {args.nvcc})")
        return 77
    version = nvcc_version(args.nvcc)
    if args.record:
        kernels = measure(args.nvcc, args.jobs)
        with open(BUDGET, "w") as f:
            json.dump({"nvcc": version, "arch": ARCH, "kernels": kernels}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"ptxas budget: recorded {len(kernels)} kernels with nvcc {version} in {BUDGET}")
        return 0
    budget = json.load(open(BUDGET))
    if budget["nvcc"] != version:  # register allocation is the compiler's: another one differs
        print(f"ptxas budget: skipped (recorded with nvcc {budget['nvcc']}, this is {version})")
        return 77
    kernels = measure(args.nvcc, args.jobs)
    failures, notes = [], []
    for key, now in sorted(kernels.items()):
        was = budget["kernels"].get(key)
        if was is None:
            failures.append(f"{key}: not recorded ({now['registers']} registers); "
                            "record it with tools/ptxas_budget.py --record")
            continue
        for field in ("registers", "spill_stores", "spill_loads", "stack", "smem"):
            if now[field] > was[field]:
                failures.append(f"{key}: {now[field]} {field.replace('_', ' ')}, recorded {was[field]}")
            elif now[field] < was[field]:
                notes.append(f"{key}: {now[field]} {field.replace('_', ' ')}, recorded {was[field]} (fewer)")
        if now["max_threads"] != was.get("max_threads"):
            failures.append(f"{key}: a launch bound of {now['max_threads']} threads (0: none), "
                            f"recorded {was.get('max_threads', 'none')}")
    for key in sorted(set(budget["kernels"]) - set(kernels)):
        failures.append(f"{key}: recorded but no longer compiled")
    for line in notes + failures:
        print(line)
    if failures:
        print(f"ptxas budget: {len(failures)} over budget or unrecorded; a deliberate change is "
              "recorded with tools/ptxas_budget.py --record (and said in the commit)")
        return 1
    print(f"ptxas budget: {len(kernels)} kernels within their recorded registers, spills, stack "
          f"and shared memory, with their recorded launch bounds (nvcc {version}, {ARCH})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
