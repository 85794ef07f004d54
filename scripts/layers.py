#!/usr/bin/env python3
"""Which of libkvgen's source files (and the command-line tools' files) call which, read from the
built object files.

A file A depends on B when a symbol A leaves undefined is defined by B. kvgen's rule is that
calls go down, never up: between folders, a file may use what its own folder and the folders
below it define (core/'s folders are layers, lowest first: --order, as core/CMakeLists.txt gives
it; api.c above them all, the tools above api.c), and between files the graph has no cycle.
Prints each upward use and each cycle (a strongly connected group of files) and exits 1 when
there is one; --graph prints every edge. --allow LOW>HIGH lets folder LOW use folder HIGH (an
upward use the build still knows of).

A folder's headers named kvg_*.h are what it offers the folders above; a header named
*_internal.h is its own files' alone: a source file of another folder (core/, lua/) that includes
one is reported (read from the sources) and fails the check too.

    python3 scripts/layers.py [BUILD_DIR] [--graph] [--order base|template|...] [--allow LOW>HIGH ...]
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


# core/'s folders, lowest first (core/CMakeLists.txt's KVGEN_LAYERS)
ORDER = "base|template|format|model|cpu|vulkan|session|generate|remote|jobs"


def options(argv):
    build, order, allow, graph = None, ORDER, set(), False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--graph":
            graph = True
        elif a in ("--order", "--allow") and i + 1 < len(argv):
            i += 1
            if a == "--order":
                order = argv[i]
            else:
                allow.add(tuple(argv[i].split(">", 1)))
        elif not a.startswith("--"):
            build = a
        i += 1
    return build or "build", order.split("|"), allow, graph


def private_includes():
    """Source files that include another folder's *_internal.h."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    headers = {}  # internal header name -> folder
    files = []
    for top in ("core", "lua"):
        for path in glob.glob(os.path.join(root, top, "**", "*.[ch]"), recursive=True):
            rel = os.path.relpath(path, root)
            files.append(rel)
            if rel.endswith("_internal.h"):
                headers[os.path.basename(rel)] = os.path.dirname(rel)
    found = []
    for rel in sorted(files):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                words = line.split()
                if len(words) >= 2 and words[0] == "#include" and words[1].startswith('"'):
                    name = os.path.basename(words[1].strip('"'))
                    if name in headers and headers[name] != os.path.dirname(rel):
                        found.append(f"private: {rel}:{n} includes {headers[name]}/{name}, a header of that folder's own")
    return found


def main():
    build, order, allow, graph = options(sys.argv[1:])
    core = os.path.join(build, "core", "CMakeFiles")
    # one object library per folder (kvgen_<folder>.dir/<folder>/*.o), then api.c's (kvgen_api.dir)
    objs = {}  # object file -> (name, rank)
    for rank, target in enumerate(order + ["api"]):
        top = os.path.join(core, f"kvgen_{target}.dir")
        for o in sorted(glob.glob(os.path.join(top, "**", "*.o"), recursive=True)):
            objs[o] = (os.path.relpath(o, top)[: -len(".o")], rank)
    if not objs:
        print(f"layers: no object files under {core}/kvgen_<folder>.dir (build first)", file=sys.stderr)
        return 2
    # the command-line tools' files too (those built): above api.c, they call the library and
    # each other, down only
    for target in ("kvgen_cli", "kvgen-mkmodel"):
        for o in sorted(glob.glob(os.path.join(core, target + ".dir", "tools", "*.o"))):
            objs[o] = ("tools/" + os.path.basename(o)[: -len(".o")], len(order) + 1)
    folder = lambda name: name.split("/")[0] if "/" in name else name
    table = {name: symbols(o) for o, (name, _) in objs.items()}
    rank = {name: r for name, r in objs.values()}
    owner = {}
    for f, (defined, _) in table.items():
        for s in defined:
            owner.setdefault(s, f)
    edges = {f: {owner[s] for s in und if s in owner and owner[s] != f} for f, (_, und) in table.items()}
    if graph:
        for f in sorted(edges):
            print(f"{f} -> {', '.join(sorted(edges[f])) or '(nothing)'}")
    upward = []
    for f in sorted(edges):
        for g in sorted(edges[f]):
            if rank[g] > rank[f] and (folder(f), folder(g)) not in allow:
                used = sorted(s for s in table[f][1] if owner.get(s) == g)
                upward.append(f"upward: {f} uses {', '.join(used)}, defined in {g} (a folder above it)")
    for line in upward:
        print(line)
    private = private_includes()
    for line in private:
        print(line)
    cycles = [g for g in strongly_connected(table.keys(), edges) if len(g) > 1]
    for g in cycles:
        print("cycle: " + " <-> ".join(g))
    print(f"layers: {len(table)} files, {sum(len(e) for e in edges.values())} calls between files, "
          f"{len(upward)} upward, {len(cycles)} cycle{'s' if len(cycles) != 1 else ''}, "
          f"{len(private)} private header{'s' if len(private) != 1 else ''} used from outside")
    return 1 if cycles or upward or private else 0


if __name__ == "__main__":
    sys.exit(main())
