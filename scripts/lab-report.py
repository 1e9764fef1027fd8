#!/usr/bin/env python3
"""Summarise scripts/lab-bench.sh runs: a table of medians (min-max, n) with
ratios to direct and to nft_dnat, the lab_* keys merged into results.json,
and an SVG chart. Standard library only (the bench installs no plotting
packages).

Input: lines "RESULT rep=N path=P key=value ..." (other lines ignored).
"""

import argparse
import json
import math
import os
import statistics
import sys
from xml.sax.saxutils import escape

# run key -> (results.json key prefix, table label, format, higher is better)
MEASURES = [
    ("tcp1_gbps", "lab_tcp_gbps", "TCP 1 stream, GSO off (Gbit/s)", "%.2f", True),
    ("tcp4_gbps", "lab_tcp4_gbps", "TCP 4 streams, GSO off (Gbit/s)", "%.2f", True),
    ("pps_1", "lab_pps_1flow", "64 B UDP, 1 flow (kpps)", "%.0f", True),
    ("pps_64k", "lab_pps_64k", "64 B UDP, 64k flows (kpps)", "%.0f", True),
    ("pps_new", "lab_pps_newflow", "64 B UDP, new flow/packet (kpps)", "%.0f", True),
    ("cpu_ns_64k", "lab_cpu_ns_pkt_64k", "core 1 busy ns/packet, 64k flows", "%.0f", False),
    ("cpu_ns_new", "lab_cpu_ns_pkt_newflow", "core 1 busy ns/packet, new flows", "%.0f", False),
    ("node_ns_64k", "lab_node_ns_pkt_64k", "node threads ns/packet, 64k flows", "%.0f", False),
    ("node_ns_new", "lab_node_ns_pkt_newflow", "node threads ns/packet, new flows", "%.0f", False),
    ("xpps_1", "lab_xdpgen_pps_1flow", "xdpgen 64 B UDP, 1 flow (kpps)", "%.0f", True),
    ("xpps_64k", "lab_xdpgen_pps_64k", "xdpgen 64 B UDP, 64k flows (kpps)", "%.0f", True),
    ("xpps_new", "lab_xdpgen_pps_newflow", "xdpgen 64 B UDP, new flow/packet (kpps)", "%.0f", True),
    ("xcpu_ns_64k", "lab_xdpgen_cpu_ns_pkt_64k", "xdpgen core 1 busy ns/packet, 64k flows", "%.0f", False),
    ("xcpu_ns_new", "lab_xdpgen_cpu_ns_pkt_newflow", "xdpgen core 1 busy ns/packet, new flows", "%.0f", False),
    ("xnode_ns_64k", "lab_xdpgen_node_ns_pkt_64k", "xdpgen node threads ns/packet, 64k flows", "%.0f", False),
    ("xnode_ns_new", "lab_xdpgen_node_ns_pkt_newflow", "xdpgen node threads ns/packet, new flows", "%.0f", False),
    ("cps", "lab_cps", "new TCP connections/s", "%.0f", True),
    ("rr_p50_us", "lab_rr_p50_us", "request/response p50 (us)", "%.0f", False),
    ("rr_p99_us", "lab_rr_p99_us", "request/response p99 (us)", "%.0f", False),
]
# What the chart shows: one panel per measure.
CHART = ["tcp1_gbps", "tcp4_gbps", "pps_64k", "pps_new", "cps", "rr_p99_us"]
COLORS = {
    "direct": "#7f7f7f",
    "nft_dnat": "#d62728",
    "haproxy": "#9467bd",
    "rivora_nat": "#1f77b4",
    "rivora_dsr": "#2ca02c",
    "rivora_l3dsr": "#17becf",
    "rivora_fullnat": "#ff7f0e",
}


def parse(path):
    runs = {}
    with open(path) as fh:
        for line in fh:
            if not line.startswith("RESULT "):
                continue
            fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
            p = fields.get("path")
            for key, val in fields.items():
                if key in ("rep", "path", "failed"):
                    continue
                try:
                    v = float(val)
                except ValueError:
                    continue
                if not math.isnan(v):
                    runs.setdefault((p, key), []).append(v)
    return runs


def table(runs, paths):
    med = {k: statistics.median(v) for k, v in runs.items()}

    def ratio(p, base, m):
        b = med.get((base, m))
        if not b or (p, m) not in med:
            return "-"
        return "%.2fx" % (med[(p, m)] / b)

    rows = []
    print("%-34s %-14s %-26s %-8s %-8s" % ("measure", "path", "median (min-max) n", "/direct", "/nft"))
    for key, _, label, fmt, _ in MEASURES:
        if not any((p, key) in runs for p in paths):
            continue
        for p in paths:
            v = runs.get((p, key))
            if not v:
                continue
            s = (fmt + " (" + fmt + "-" + fmt + ") %d") % (med[(p, key)], min(v), max(v), len(v))
            print("%-34s %-14s %-26s %-8s %-8s" % (label, p, s, ratio(p, "direct", key), ratio(p, "nft_dnat", key)))
            rows.append((label, p, s, ratio(p, "direct", key), ratio(p, "nft_dnat", key)))
        print()
    return med


# The lab targets, per generator ("" trafgen, "x" xdpgen): the node's ns
# per delivered packet (its receive threads' run time, which other
# processes on its core do not inflate), and their ratios: issue 19's to
# DSR's; full NAT's (two rewrites, a port per new flow) to NAT's.
TARGETS = [("nat_over_dsr", "rivora_nat", "rivora_dsr", "64k", 1.15),
           ("l3dsr_over_dsr", "rivora_l3dsr", "rivora_dsr", "64k", 1.15),
           ("newflow_nat_over_dsr", "rivora_nat", "rivora_dsr", "new", 1.3),
           ("fullnat_over_nat", "rivora_fullnat", "rivora_nat", "64k", 1.15)]


def summary(med):
    """The targets' keys: lab_<gen>_ns_per_pkt_<mode>,
    lab_<gen>_newflow_ns_per_pkt_<mode> and lab_<gen>_<ratio>."""
    out = {}
    for gen, pre in (("trafgen", ""), ("xdpgen", "x")):
        for mode in ("dsr", "nat", "l3dsr", "fullnat"):
            v = med.get(("rivora_" + mode, pre + "node_ns_64k"))
            if v is not None:
                out["lab_%s_ns_per_pkt_%s" % (gen, mode)] = v
            v = med.get(("rivora_" + mode, pre + "node_ns_new"))
            if v is not None and mode != "l3dsr":
                out["lab_%s_newflow_ns_per_pkt_%s" % (gen, mode)] = v
        for name, path, base, kind, _ in TARGETS:
            a = med.get((path, pre + "node_ns_" + kind))
            b = med.get((base, pre + "node_ns_" + kind))
            if a is not None and b:
                out["lab_%s_%s" % (gen, name)] = a / b
    return out


def print_targets(summ):
    for gen in ("trafgen", "xdpgen"):
        for name, _, _, _, limit in TARGETS:
            v = summ.get("lab_%s_%s" % (gen, name))
            if v is not None:
                print("%-7s %-22s %.2f (target <= %.2f: %s)" % (gen, name, v, limit, "met" if v <= limit else "NOT met"))


def write_results(med, out):
    cur = {}
    if os.path.exists(out):
        try:
            cur = json.load(open(out))
        except ValueError:
            cur = {}
    # A path or measure not run now must not keep an old figure beside new
    # ones: lab keys are replaced as a whole.
    cur = {k: v for k, v in cur.items() if not k.startswith("lab_")}
    n = 0
    for key, prefix, _, _, _ in MEASURES:
        for (p, k), v in med.items():
            if k == key:
                cur["%s_%s" % (prefix, p)] = round(v, 3)
                n += 1
    for k, v in summary(med).items():
        cur[k] = round(v, 3)
        n += 1
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as fh:
        json.dump(dict(sorted(cur.items())), fh, indent=2)
        fh.write("\n")
    print("wrote %d lab keys to %s" % (n, out))


def chart(runs, med, paths, out):
    """Grouped horizontal bars, one panel per measure: the median as a bar,
    min-max as a whisker, the ratio to nft_dnat as text."""
    labels = {m[0]: m[2] for m in MEASURES}
    panels = [k for k in CHART if any((p, k) in med for p in paths)]
    bar_h, gap, label_w, plot_w = 16, 4, 110, 420
    panel_h = 30 + len(paths) * (bar_h + gap) + 16
    width = label_w + plot_w + 170
    height = 40 + panel_h * len(panels) + 20
    svg = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (width, height),
        '<rect width="100%" height="100%" fill="white"/>',
        '<text x="10" y="22" font-size="14" font-weight="bold">Rivora lab bench: medians, min-max whiskers, ratio to nft_dnat</text>',
    ]
    y0 = 40
    for key in panels:
        vals = [max(runs.get((p, key), [0])) for p in paths]
        top = max(vals) or 1.0
        svg.append('<text x="10" y="%d" font-weight="bold">%s%s</text>' % (
            y0 + 14, escape(labels[key]), " (lower is better)" if key.startswith(("rr_", "cpu_")) else ""))
        y = y0 + 24
        base = med.get(("nft_dnat", key))
        for p in paths:
            svg.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (label_w - 6, y + bar_h - 4, escape(p)))
            if (p, key) in med:
                m = med[(p, key)]
                v = runs[(p, key)]
                w = plot_w * m / top
                svg.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>' % (
                    label_w, y, w, bar_h, COLORS.get(p, "#444")))
                lo, hi = label_w + plot_w * min(v) / top, label_w + plot_w * max(v) / top
                mid = y + bar_h / 2
                svg.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>' % (lo, mid, hi, mid))
                for x in (lo, hi):
                    svg.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>' % (x, y + 3, x, y + bar_h - 3))
                text = ("{:,.0f}" if m >= 100 else "{:.2f}").format(m)
                if base and p != "nft_dnat":
                    text += "  (%.2fx)" % (m / base)
                svg.append('<text x="%.1f" y="%d">%s</text>' % (max(hi, label_w + w) + 4, y + bar_h - 4, escape(text)))
            else:
                svg.append('<text x="%d" y="%d" fill="#888">n/a</text>' % (label_w + 4, y + bar_h - 4))
            y += bar_h + gap
        y0 += panel_h
    svg.append("</svg>")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as fh:
        fh.write("\n".join(svg) + "\n")
    print("wrote chart %s" % out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs")
    ap.add_argument("--paths", required=True)
    ap.add_argument("--results", default="")
    ap.add_argument("--chart", default="")
    a = ap.parse_args()
    paths = a.paths.split()
    runs = parse(a.runs)
    if not runs:
        print("lab-report: no results in %s" % a.runs, file=sys.stderr)
        return 1
    med = table(runs, paths)
    print_targets(summary(med))
    if a.results:
        write_results(med, a.results)
    if a.chart:
        chart(runs, med, paths, a.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
