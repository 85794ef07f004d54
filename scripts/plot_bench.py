#!/usr/bin/env python3
"""Plots `kvgen bench --json` output as one PNG with two panels:

  left:  per-token cost (ms per generated token) against context length, with the KV cache
         (one decode step over the cached prefix: O(N) per token) and without it (every step
         recomputes the whole prefix: O(N^2) per token), per backend; from "no_cache_curve"
         (kvgen bench --no-cache-depth LIST).
  right: decode tokens/s against cache depth per backend; from "decode" (--depths LIST), with
         llama.cpp's CPU figure at the same depths when the run had a peer (--peer llama-bench).

Usage: plot_bench.py BENCH.json -o OUT.png [--note TEXT]
Needs matplotlib (Debian: python3-matplotlib). Figures from one run are comparable with each
other only: the caption carries the machine's load average the run recorded.
"""
import argparse
import json
import sys

STYLE = {"reference": "tab:gray", "cpu": "tab:blue", "vulkan": "tab:red"}


def median(stats):
    v = stats.get("median") if stats else None
    return v if isinstance(v, (int, float)) and v > 0 else None


def main(argv):
    ap = argparse.ArgumentParser(description="plot kvgen bench --json output")
    ap.add_argument("json", help="the file kvgen bench --json wrote")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--note", default="", help="a line added to the caption")
    args = ap.parse_args(argv)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_bench.py: matplotlib is not installed (apt install python3-matplotlib)")

    with open(args.json, encoding="utf-8") as f:
        bench = json.load(f)
    backends = [b for b in bench.get("backends", []) if b.get("ok")]
    if not backends:
        sys.exit("plot_bench.py: %s: no backend ran to the end" % args.json)

    fig, (cost, dec) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=90)
    curves = 0
    for b in backends:
        name, color = b["backend"], STYLE.get(b["backend"])
        pts = [(c["depth"], median(c.get("cached_tok_s")), median(c.get("tok_s")))
               for c in b.get("no_cache_curve", [])]
        if pts:
            d = [p[0] for p in pts]
            cost.plot(d, [1000.0 / p[1] if p[1] else float("nan") for p in pts], "o-", color=color,
                      label="%s, cache" % name)
            cost.plot(d, [1000.0 / p[2] if p[2] else float("nan") for p in pts], "s--", color=color,
                      label="%s, no cache" % name)
            curves += 1
        pts = [(c["depth"], median(c.get("tok_s"))) for c in b.get("decode", [])]
        pts = [p for p in pts if p[1]]
        if pts:
            dec.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=name)
    peer = bench.get("peer") or {}
    if peer.get("ran"):
        pts = []
        for key, v in peer.items():
            if key.startswith("decode_") and key.endswith("_tok_s") and isinstance(v, (int, float)) and v > 0:
                pts.append((int(key[len("decode_"):-len("_tok_s")]), v))
        pts.sort()
        if pts:
            dec.plot([p[0] for p in pts], [p[1] for p in pts], "^:", color="black",
                     label="llama.cpp CPU (%s)" % peer.get("name", "peer"))
    if curves == 0:
        cost.text(0.5, 0.5, "no no_cache_curve in this file\n(kvgen bench --no-cache-depth LIST)",
                  ha="center", va="center", transform=cost.transAxes)
    cost.set_xlabel("context length (tokens before the new one)")
    cost.set_ylabel("ms per generated token")
    cost.set_yscale("log")
    cost.set_title("per-token cost: cache (O(N)) vs recompute (O(N²))", fontsize=10)
    cost.grid(True, which="both", alpha=0.3)
    lo, hi = cost.get_ylim()
    cost.set_ylim(lo, hi * 30)  # room above the curves for the legend
    cost.legend(fontsize=6.5, ncol=3, loc="upper left")
    dec.set_xlabel("cache depth (tokens)")
    dec.set_ylabel("decode tokens/s")
    dec.set_title("decode speed against cache depth", fontsize=10)
    dec.set_ylim(bottom=0)
    dec.grid(True, alpha=0.3)
    dec.legend(fontsize=7)

    model = bench.get("model", {})
    s = bench.get("settings", {})
    load = bench.get("load_average", {})
    caption = "%s (%s), kvgen %s; medians of %s reps; load average %s -> %s" % (
        model.get("name", "?"), model.get("path", "?"), bench.get("kvgen_version", "?"), s.get("reps", "?"),
        fmt(load.get("start")), fmt(load.get("end")))
    if args.note:
        caption += "\n" + args.note
    fig.text(0.5, 0.01, caption, ha="center", va="bottom", fontsize=7.5)
    fig.tight_layout(rect=(0, 0.08 if args.note else 0.05, 1, 1))
    fig.savefig(args.output)
    return 0


def fmt(v):
    return "%.1f" % v if isinstance(v, (int, float)) else "?"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
