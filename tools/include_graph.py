#!/usr/bin/env python3
"""Which layer of the engine includes which: src/<layer>/ and kernels/ (its cpu/ and cuda/ too).

Prints one line per layer with the layers its files include, and exits 1 (naming the includes
that close it) when two layers reach each other, so the graph in docs/architecture.md stays
without a loop. Also exits 1 on a quoted include that is not a path from the repository root
("src/core/error.h", "kernels/ops.h", "tests/test_util.h"), in src/, kernels/, tests/ and tools/
(the emulator's stand-ins for CUDA's system headers, tests/cuda_emu/, excepted).
Standard library only; ctest runs it as `include_graph`.
Usage: tools/include_graph.py [REPO_ROOT]
"""
import collections
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    parts = os.path.relpath(path, root).split(os.sep)
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "kernels":
        return "kernels"
    return None


def resolve(name):
    # the build's one include root is the repository's
    path = os.path.normpath(os.path.join(root, name))
    return path if os.path.isfile(path) else None


def unrooted_includes():
    found = []
    for top in ("src", "kernels", "tests", "tools"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            if os.path.relpath(folder, root).startswith(os.path.join("tests", "cuda_emu")):
                continue
            for name in names:
                if name.endswith((".h", ".cpp", ".cu", ".cuh", ".c")):
                    path = os.path.join(folder, name)
                    with open(path, errors="replace") as f:
                        for number, line in enumerate(f, 1):
                            m = INCLUDE.match(line)
                            if m and not resolve(m.group(1)):
                                found.append(f"{os.path.relpath(path, root)}:{number}: \"{m.group(1)}\"")
    return found


def main():
    edges = collections.defaultdict(set)
    witness = {}
    for top in ("src", "kernels"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(folder, name)
                here = layer_of(path)
                with open(path, errors="replace") as f:
                    for line in f:
                        m = INCLUDE.match(line)
                        target = resolve(m.group(1)) if m else None
                        there = layer_of(target) if target else None
                        if there and there != here:
                            edges[here].add(there)
                            witness.setdefault((here, there), f"{os.path.relpath(path, root)} includes {m.group(1)}")
    for layer in sorted(edges):
        print(f"{layer:8} -> {', '.join(sorted(edges[layer]))}")

    def reaches(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    status = 0
    unrooted = unrooted_includes()
    if unrooted:
        print("error: includes not rooted at the repository root:")
        for line in unrooted:
            print("  " + line)
        status = 1
    loops = sorted(a for a in edges if a in reaches(a))
    if loops:
        print("error: layers that include each other: " + ", ".join(loops))
        for a, b in sorted(witness):
            if a in loops and b in loops and a in reaches(b):
                print(f"  {a} -> {b}: {witness[(a, b)]}")
        return 1
    print("no loop")
    return status


if __name__ == "__main__":
    sys.exit(main())
