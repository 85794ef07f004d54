#!/usr/bin/env python3
"""Which of libkvgen's source files (and the command-line tools' files) call which, read from the
built object files.

A file A depends on B when a symbol A leaves undefined is defined by B. kvgen's rule is that
calls go down, never up, so this graph must have no cycle. Prints each cycle (a strongly
connected group of files) and exits 1 when there is one; --graph prints every edge.

    python3 scripts/layers.py [BUILD_DIR] [--graph]
"""
import glob
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", "--format=posix", obj], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper():  # global definitions only: static functions cannot be called across files
            defined.add(name)
    return defined, undefined


def strongly_connected(nodes, edges):
    index, low, on_stack, stack, groups, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            groups.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return groups


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    build = args[0] if args else "build"
    objs = sorted(glob.glob(os.path.join(build, "core", "CMakeFiles", "kvgen.dir", "**", "*.o"), recursive=True))
    if not objs:
        print(f"layers: no object files under {build}/core/CMakeFiles/kvgen.dir (build first)", file=sys.stderr)
        return 2
    # the command-line tools' files too (those built): they call the library and each other, down only
    tools = []
    for target in ("kvgen_cli", "kvgen-mkmodel"):
        tools += sorted(glob.glob(os.path.join(build, "core", "CMakeFiles", target + ".dir", "tools", "*.o")))
    objs += tools
    name = lambda o: ("tools/" if o in tools else "") + os.path.basename(o)[: -len(".o")]
    table = {name(o): symbols(o) for o in objs}
    owner = {}
    for f, (defined, _) in table.items():
        for s in defined:
            owner[s] = f
    edges = {f: {owner[s] for s in und if s in owner and owner[s] != f} for f, (_, und) in table.items()}
    if "--graph" in sys.argv:
        for f in sorted(edges):
            print(f"{f} -> {', '.join(sorted(edges[f])) or '(nothing)'}")
    cycles = [g for g in strongly_connected(table.keys(), edges) if len(g) > 1]
    for g in cycles:
        print("cycle: " + " <-> ".join(g))
    print(f"layers: {len(table)} files, {sum(len(e) for e in edges.values())} calls between files, "
          f"{len(cycles)} cycle{'s' if len(cycles) != 1 else ''}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
