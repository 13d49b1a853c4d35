"""The benchmark's report: the tables of medians, ratios and rates, growth, results.json and the plots."""
import json
import os
import statistics

import bench_common as C
from bench_common import (GPU_COUNTS, GROWTH_BYTES, LIMITS, LIMITS_TEXT, PROC_COUNTS, SCENARIOS, UTILITY, VARIANTS,
                          DESCRIPTIONS, cell, clean, div, gb, log, med, nz, ok)

# --- the report --------------------------------------------------------------------------------------------

# Every figure a run may have, with its label in the first table (None: in results.json and the later
# tables only).
FIGURES = [
    ("dump_s", "dump s"), ("criu_dump_s", "criu"), ("device_dump_s", "hooks"), ("checkpoint_s", "drv ckpt"),
    ("write_s", "img write"), ("restore_s", "restore s"), ("criu_restore_s", "criu"),
    ("device_restore_s", "hooks"), ("restore_cold_s", "cold rest."), ("restore_to_ready_s", "ready s"),
    ("image_gib", "image GiB"), ("image_alloc_gib", "alloc GiB"), ("criu_peak_mib", "peak MiB"),
    ("lock_s", None), ("gpu_state_gib", None), ("gpu_image_gib", None), ("written_gib", None),
    ("zero_pct", None), ("gpu_files", None), ("write_gbps", None), ("gpu_files_gib", None),
    ("gpu_files_alloc_gib", None), ("restore_unlock_s", None), ("driver_load_s", None), ("gpu_check_s", None),
    ("dump_rss0_gib", None), ("dump_peak_rss_gib", None), ("dump_cache_gib", None), ("restore_peak_rss_gib", None),
    ("restore_cache_gib", None), ("preflight_gib", None), ("own_lock_ms", None), ("own_ckpt_ms", None),
    ("own_restore_ms", None), ("criu_restore_cold_s", None), ("device_restore_cold_s", None), ("restore_cold_to_ready_s", None),
    ("restore_unlock_cold_s", None), ("gpu_check_cold_s", None), ("sync_s", None), ("start_s", None),
    ("trip_s", None), ("cold_read_gib", None),
]


def normalize(r):
    """A run of --cold-cache had one restore, cold: its figures count as the cold restore's."""
    if not r.get("cold_cache") or "restore_cold_s" in r:
        return r
    r = dict(r)
    for warm, cold in (("restore_s", "restore_cold_s"), ("criu_restore_s", "criu_restore_cold_s"),
                       ("device_restore_s", "device_restore_cold_s"), ("restore_to_ready_s", "restore_cold_to_ready_s"),
                       ("restore_unlock_s", "restore_unlock_cold_s"), ("gpu_check_s", "gpu_check_cold_s")):
        if warm in r:
            r[cold] = r.pop(warm)
    return r


def rates(t, gpu_gib):
    """GB/s of each phase of one (scenario, variant): GPU bytes over the phase's seconds. The in-tree plugin
    logs no phases of its own: its hooks stand for the driver's checkpoint and restore."""
    gpu = gb(gpu_gib)
    crius_bytes = t["image_alloc_gib"] - (t["gpu_files_alloc_gib"] if ok(t["gpu_files_alloc_gib"]) else 0.0)
    return {
        "checkpoint": div(gpu, t["checkpoint_s"] if ok(t["checkpoint_s"]) else t["device_dump_s"]),
        "write": div(gpu, t["write_s"]),
        "written": div(gb(t["written_gib"]), t["write_s"]),
        "criu_dump": div(gb(crius_bytes), t["criu_dump_s"]),
        "restore": div(gpu, t["restore_unlock_s"] if ok(t["restore_unlock_s"]) else t["device_restore_s"]),
        "restore_e2e": div(gpu, t["restore_s"]),
        "restore_cold_e2e": div(gpu, t["restore_cold_s"]),
    }


def incremental_lines(runs):
    """Section 6: the second of two periodic dumps (--track-mem --prev-images-dir) against the first."""
    if not runs:
        return []
    lines = ["", "6. incremental: a full dump (left running), then a dump against it (--track-mem --prev-images-dir), "
             "medians: seconds, GiB on disk, GiB of GPU state written by our plugin and referenced in the first "
             "image; the restore is of the second image"]
    cols = [("full dump s", "full_dump_s"), ("2nd dump s", "incr_dump_s"), ("full GiB", "full_image_alloc_gib"),
            ("2nd GiB", "incr_image_alloc_gib"), ("full wrote", "full_written_gib"), ("2nd wrote", "incr_written_gib"),
            ("referenced", "incr_parent_gib"), ("restore s", "restore_s")]
    lines.append(f"{'scenario / variant':<20}" + "".join(f"{c:>12}" for c, _ in cols))
    for s in dict.fromkeys(r["scenario"] for r in runs):
        for v in dict.fromkeys(r["variant"] for r in runs):
            rows = [r for r in runs if r["scenario"] == s and r["variant"] == v]
            if rows:
                lines.append(f"{s + ' ' + v:<20}" + "".join(cell(med(rows, k), 12) for _, k in cols))
    return lines


def report(results, cold, out_dir, failures=(), meta=None):
    incremental = [r for r in results if r.get("incremental")]
    results = [normalize(r) for r in results if not r.get("incremental")]
    keys = [k for k, _ in FIGURES]
    scenarios = [s for s in list(SCENARIOS) + sorted({r["scenario"] for r in results} - set(SCENARIOS))
                 if any(r["scenario"] == s for r in results)]
    variants = [v for v in list(VARIANTS) + sorted({r["variant"] for r in results} - set(VARIANTS))
                if any(r["variant"] == v for r in results)]
    table = {}
    for s in scenarios:
        for v in variants:
            rows = [r for r in results if r["scenario"] == s and r["variant"] == v]
            table[(s, v)] = {k: med(rows, k) for k in keys}
            table[(s, v)]["runs"] = len(rows)
    # The GPU bytes of a scenario: our plugin's summary line (the in-tree plugin does not tell them).
    gpu_of = {s: med([r for r in results if r["scenario"] == s], "gpu_state_gib") for s in scenarios}
    base = C.BASELINE if C.BASELINE in variants else None
    cmp_variants = [v for v in variants if v != base]

    lines = []
    for v in variants:
        lines.append(f"{v}: {UTILITY.get(v, DESCRIPTIONS.get(v, ''))}")
    if meta:
        lines.append(meta)
    lines.append("")
    lines.append(f"1. seconds and sizes, medians over rounds (runs per variant in brackets); ratio = variant / "
                 f"{C.BASELINE} (below 1: faster or smaller). criu = CRIU's own work, hooks = inside the CUDA plugin's "
                 "hooks, drv ckpt = the driver's checkpoint call (our summary line), img write = our GPU image's "
                 "write (inside the hooks), cold rest. = restore with the page cache dropped, ready = restore to "
                 "the first verified answer, image = apparent size, alloc = blocks on disk")
    labelled = [(k, label) for k, label in FIGURES if label]
    w0, w = 24, 11
    lines.append(f"{'scenario / variant':<{w0}}" + "".join(f"{label:>{w}}" for _, label in labelled))
    for s in scenarios:
        for v in variants:
            t = table[(s, v)]
            lines.append(f"{(s + ' ' + v + ' [' + str(t['runs']) + ']'):<{w0}}" +
                         "".join(cell(t[k], w, 1 if k == "criu_peak_mib" else 2) for k, _ in labelled))
        if base:
            for v in cmp_variants:
                lines.append(f"{(s + ' ratio ' + v):<{w0}}" + "".join(
                    cell(div(table[(s, v)][k], table[(s, base)][k]), w) for k, _ in labelled))

    if base:
        lines.append("")
        lines.append(f"2. against the baseline ({base}), from the medians: dump, image (apparent / allocated), "
                     "restore (warm / cold page cache) and restore-to-ready as ratios variant / baseline; and "
                     "our dump over our driver checkpoint call (1.00 would be a dump that costs nothing beyond "
                     "the driver)")
        cols = ["dump", "dump/ckpt", "image", "img alloc", "restore", "rest. cold", "ready"]
        lines.append(f"{'scenario / variant':<{w0}}" + "".join(f"{c:>{w}}" for c in cols))
        for s in scenarios:
            b = table[(s, base)]
            for v in cmp_variants:
                t = table[(s, v)]
                vals = [div(t["dump_s"], b["dump_s"]), div(t["dump_s"], t["checkpoint_s"]),
                        div(t["image_gib"], b["image_gib"]), div(t["image_alloc_gib"], b["image_alloc_gib"]),
                        div(t["restore_s"], b["restore_s"]), div(t["restore_cold_s"], b["restore_cold_s"]),
                        div(t["restore_to_ready_s"], b["restore_to_ready_s"])]
                lines.append(f"{(s + ' ' + v):<{w0}}" + "".join(cell(x, w) for x in vals))

    lines.append("")
    lines.append("3. rates, GB/s (1e9 bytes/s) of GPU state over each phase's median seconds. GPU GiB: our summary "
                 "line. drv ckpt: the driver's checkpoint call (in-tree: its dump hooks); img write: GPU bytes over "
                 "our GPU image's write time (data: the bytes actually written); criu dump: what CRIU wrote itself "
                 "(allocated image less our GPU image files) over CRIU's own dump seconds; restore: the driver's "
                 "restore+unlock (in-tree: its restore hook); e2e: over the whole criu restore, warm and cold")
    cols = [("GPU GiB", None), ("zero %", None), ("drv ckpt", "checkpoint"), ("img write", "write"),
            ("data", "written"), ("criu dump", "criu_dump"), ("restore", "restore"), ("e2e", "restore_e2e"),
            ("e2e cold", "restore_cold_e2e")]
    lines.append(f"{'scenario / variant':<{w0}}" + "".join(f"{c:>{w}}" for c, _ in cols))
    rate_table = {}
    for s in scenarios:
        for v in variants:
            t = table[(s, v)]
            rt = rate_table[(s, v)] = rates(t, gpu_of[s])
            lines.append(f"{(s + ' ' + v):<{w0}}" + cell(gpu_of[s], w) + cell(t["zero_pct"], w, 1) +
                         "".join(cell(rt[k], w) for _, k in cols[2:]))
    lines.append(LIMITS_TEXT)

    lines += growth_lines(table, rate_table, gpu_of, scenarios, variants, results)
    lines += incremental_lines(incremental)

    if cold:
        lines.append("")
        lines.append("start from scratch against restore to ready (coldstart: torch.compile mode=reduce-overhead, "
                     "2 GiB; serve: to the first answer), medians, seconds")
        for what in dict.fromkeys(c["what"] for c in cold):
            rows = [c for c in cold if c["what"] == what]
            read = [c["read_gib"] for c in rows if "read_gib" in c]
            lines.append(f"  {what:<66} {statistics.median(c['seconds'] for c in rows):8.2f}"
                         + (f"  ({statistics.median(read):.1f} GiB read from disk)" if read else ""))
    if failures:
        lines.append("")
        lines.append(f"{len(failures)} round trip(s) failed or skipped:")
        lines += [f"  {f['scenario']} {f['variant']} round {f['round']}: {f['error']}" for f in failures]
    text = "\n".join(lines)
    print(text, flush=True)
    with open(os.path.join(out_dir, "results.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(clean({"runs": results + incremental, "cold_start": cold, "failures": list(failures), "utilities": UTILITY,
                         "baseline": C.BASELINE, "limits_gbps": dict(LIMITS),
                         "medians": {f"{s}/{v}": m for (s, v), m in table.items()},
                         "rates_gbps": {f"{s}/{v}": m for (s, v), m in rate_table.items()},
                         "gpu_gib": gpu_of}), f, indent=1)
    plot(table, rate_table, scenarios, variants, cold, os.path.join(out_dir, "bench.png"))
    plot_growth(table, scenarios, variants, gpu_of, os.path.join(out_dir, "growth.png"))
    counts = [n for n in GPU_COUNTS if f"{n}gpu" in scenarios]
    if counts:
        plot_scaling(table, counts, variants, os.path.join(out_dir, "scaling.png"))


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        log("matplotlib not available: no plot")
        return None


def plot_scaling(table, counts, variants, path):
    """Seconds against the number of GPUs (one process per GPU), ours and in-tree."""
    plt = pyplot()
    if not plt:
        return
    panels = [("device_dump_s", "device phases of dump, s"), ("device_restore_s", "device phases of restore, s"),
              ("dump_s", "criu dump, s"), ("restore_s", "criu restore, s")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
    for ax, (key, title) in zip(axes, panels):
        for v in variants:
            ys = [table[(f"{n}gpu", v)][key] for n in counts]
            ax.plot(counts, ys, marker="o", label=v)
            for n, y in zip(counts, ys):
                if ok(y):
                    ax.annotate(f"{y:.2f}", (n, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.set_xticks(counts)
        ax.set_xlabel("GPUs (one 4 GiB process each)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"plot: {path}")


def plot(table, rate_table, scenarios, variants, cold, path):
    """Dump and restore seconds by phase, image size, ratios against the baseline and the phases' rates
    against the machine's limits (and the expensive start, when measured)."""
    plt = pyplot()
    if not plt:
        return
    pairs = [(s, v) for s in scenarios for v in variants]
    xs = list(range(len(pairs)))
    ticks = [f"{s}\n{v}" for s, v in pairs]
    ncols = 3 + (1 if cold else 0)
    fig, axes = plt.subplots(2, ncols, figsize=(6.2 * ncols, 10.5))
    axes = axes.flatten()

    def stacked(ax, segments, title, totals, marks=()):
        bottom = [0.0] * len(pairs)
        for label, vals, color in segments:
            vals = [nz(x) for x in vals]
            if any(vals):
                ax.bar(xs, vals, 0.7, bottom=bottom, label=label, color=color)
                bottom = [b + x for b, x in zip(bottom, vals)]
        for x, total in zip(xs, totals):
            if ok(total):
                ax.annotate(f"{total:.2f}", (x, total), textcoords="offset points", xytext=(0, 3), ha="center",
                            fontsize=7)
        for label, vals, marker in marks:
            pts = [(x, y) for x, y in zip(xs, vals) if ok(y)]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, color="black", zorder=3,
                           label=label)
                for x, y in pts:
                    ax.annotate(f"{y:.1f}", (x, y), textcoords="offset points", xytext=(9, -3), fontsize=7)
        tops = [nz(x) for x in list(totals) + [y for _, vals, _ in marks for y in vals]]
        ax.set_ylim(0, max(tops + [bottom_max(bottom)]) * 1.12 or 1)
        ax.set_xticks(xs, ticks, fontsize=7)
        ax.set_title(title)
        ax.legend(fontsize=7)

    def bottom_max(bottom):
        return max(bottom) if bottom else 0.0

    t = [table[p] for p in pairs]
    # Dump: the driver's checkpoint call, our GPU image's write, the rest of the hooks, CRIU's own work.
    ckpt = [r["checkpoint_s"] for r in t]
    write = [nz(r["write_s"]) for r in t]
    hooks_rest = [max(0.0, nz(r["device_dump_s"]) - nz(c) - w) if ok(c) else 0.0 for r, c, w in zip(t, ckpt, write)]
    intree_hooks = [r["device_dump_s"] if not ok(c) else 0.0 for r, c in zip(t, ckpt)]
    stacked(axes[0], [("driver checkpoint call (ours)", ckpt, "#1f77b4"), ("GPU image write (ours)", write, "#17becf"),
                      ("rest of the hooks (ours)", hooks_rest, "#aec7e8"), ("hooks (in-tree)", intree_hooks, "#ff7f0e"),
                      ("CRIU's own work", [r["criu_dump_s"] for r in t], "#c7c7c7")],
            "criu dump, s, by phase", [r["dump_s"] for r in t])
    # Restore: our GPU image check, the driver's restore+unlock, the rest of the hooks, CRIU's own work;
    # the cold restore's total as a marker.
    check = [nz(r["gpu_check_s"]) for r in t]
    unlock = [r["restore_unlock_s"] for r in t]
    rest = [max(0.0, nz(r["device_restore_s"]) - nz(u) - c) if ok(u) else 0.0 for r, u, c in zip(t, unlock, check)]
    intree_r = [r["device_restore_s"] if not ok(u) else 0.0 for r, u in zip(t, unlock)]
    stacked(axes[1], [("GPU image check (ours)", check, "#17becf"), ("driver restore+unlock (ours)", unlock, "#1f77b4"),
                      ("rest of the hooks (ours)", rest, "#aec7e8"), ("hooks (in-tree)", intree_r, "#ff7f0e"),
                      ("CRIU's own work", [r["criu_restore_s"] for r in t], "#c7c7c7")],
            "criu restore, s, by phase (warm page cache)", [r["restore_s"] for r in t],
            [("restore with the page cache dropped", [r["restore_cold_s"] for r in t], "v")])
    # Image: apparent size, and the blocks it takes (the GPU image files are sparse).
    ax = axes[2]
    app = [nz(r["image_gib"]) for r in t]
    alloc = [nz(r["image_alloc_gib"]) for r in t]
    gpu_alloc = [nz(r["gpu_files_alloc_gib"]) for r in t]
    ax.bar(xs, app, 0.7, color="none", edgecolor="#555555", hatch="//", label="apparent")
    ax.bar(xs, [a - g for a, g in zip(alloc, gpu_alloc)], 0.5, color="#c7c7c7", label="allocated: CRIU's images")
    ax.bar(xs, gpu_alloc, 0.5, bottom=[a - g for a, g in zip(alloc, gpu_alloc)], color="#17becf",
           label="allocated: our GPU image")
    for x, a, b in zip(xs, app, alloc):
        ax.annotate(f"{b:.2f}" + (f" / {a:.2f}" if abs(a - b) > 0.05 else ""), (x, a), textcoords="offset points",
                    xytext=(0, 3), ha="center", fontsize=7)
    ax.set_ylim(0, max(app + alloc + [0.0]) * 1.12 or 1)
    ax.set_xticks(xs, ticks, fontsize=7)
    ax.set_title("image on disk, GiB (allocated / apparent)")
    ax.legend(fontsize=7)
    # Ratios against the baseline.
    ax = axes[3]
    others = [v for v in variants if v != C.BASELINE]
    metrics = [("dump", "dump_s"), ("image alloc", "image_alloc_gib"), ("restore", "restore_s"),
               ("restore cold", "restore_cold_s")]
    if C.BASELINE in variants and others:
        groups = [(s, v) for s in scenarios for v in others]
        width = 0.8 / len(metrics)
        top = 1.2
        for i, (label, key) in enumerate(metrics):
            vals = [div(table[(s, v)][key], table[(s, C.BASELINE)][key]) for s, v in groups]
            if not any(ok(x) for x in vals):
                continue
            top = max([top] + [x * 1.15 for x in vals if ok(x)])
            pos = [g + (i - (len(metrics) - 1) / 2) * width for g in range(len(groups))]
            bars = ax.bar(pos, [nz(x) for x in vals], width, label=label)
            ax.bar_label(bars, labels=[f"{x:.2f}" if ok(x) else "" for x in vals], fontsize=6)
        dc = [div(table[g]["dump_s"], table[g]["checkpoint_s"]) for g in groups]
        pts = [(i, y) for i, y in enumerate(dc) if ok(y)]
        if pts:
            ax2 = ax.twinx()
            ax2.scatter([p[0] for p in pts], [p[1] for p in pts], marker="D", color="black",
                        label="our dump / our driver checkpoint call (right axis)")
            ax2.set_ylim(bottom=0, top=max(2.0, max(p[1] for p in pts) * 1.2))
            ax2.legend(fontsize=7, loc="upper right")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylim(0, top)
        ax.set_xticks(range(len(groups)), [f"{s}\n{v}" for s, v in groups], fontsize=7)
        ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"ratio variant / {C.BASELINE} (below 1: better)")
    # Rates against the machine's limits.
    ax = axes[4]
    phases = [("driver checkpoint (in-tree: hooks)", "checkpoint"), ("GPU image write", "write"),
              ("CRIU's own dump", "criu_dump"), ("driver restore (in-tree: hooks)", "restore"),
              ("restore, end to end", "restore_e2e"), ("restore cold, end to end", "restore_cold_e2e")]
    phases = [p for p in phases if any(ok(rate_table[q][p[1]]) for q in pairs)]
    width = 0.8 / max(1, len(phases))
    for i, (label, key) in enumerate(phases):
        vals = [rate_table[q][key] for q in pairs]
        pos = [x + (i - (len(phases) - 1) / 2) * width for x in xs]
        bars = ax.bar(pos, [nz(x) for x in vals], width, label=label)
        ax.bar_label(bars, labels=[f"{x:.1f}" if ok(x) else "" for x in vals], fontsize=5)
    for (label, gbps), style in zip(LIMITS, (":", "--", "-.", (0, (1, 4)))):
        ax.axhline(gbps, color="black", linewidth=0.9, linestyle=style, label=f"limit: {label}, {gbps} GB/s")
    # Log scale: the disk's ~1.2 GB/s and the writers' ~13 GB/s both stay readable.
    ax.set_yscale("log")
    top = max([nz(rate_table[q][k]) for q in pairs for _, k in phases] + [g for _, g in LIMITS])
    ax.set_ylim(0.2, top * 6)
    ax.set_xticks(xs, ticks, fontsize=7)
    ax.set_title("GB/s of GPU state per phase (log scale), against the machine's limits")
    ax.legend(fontsize=6, loc="upper left", ncol=2)
    # Restore-to-ready and the start-up of each workload.
    ax = axes[5]
    ready = [r["restore_to_ready_s"] for r in t]
    bars = ax.bar(xs, [nz(x) for x in ready], 0.7, color="#1f77b4", label="restore to the first verified answer")
    ax.bar_label(bars, labels=[f"{x:.2f}" if ok(x) else "" for x in ready], fontsize=7)
    starts = [r["start_s"] for r in t]
    pts = [(x, y) for x, y in zip(xs, starts) if ok(y)]
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="_", s=300, color="black",
                   label="workload start-up (from scratch)")
    ax.set_xticks(xs, ticks, fontsize=7)
    ax.set_title("restore-to-ready against a fresh start, s")
    ax.legend(fontsize=7)
    if cold:
        ax = axes[6]
        whats = list(dict.fromkeys(c["what"] for c in cold))
        vals = [statistics.median(c["seconds"] for c in cold if c["what"] == w) for w in whats]
        colors = ["#999999", "#bbbbbb", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
        bars = ax.barh(whats, vals, color=(colors * 2)[:len(whats)])
        ax.bar_label(bars, fmt="%.1f s", fontsize=8)
        ax.set_title("start from scratch vs restore to ready / first answer")
        ax.invert_yaxis()
    for ax in axes[6 + (1 if cold else 0):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"plot: {path}")

def growth_lines(table, rate_table, gpu_of, scenarios, variants, results):
    """Sections 4 and 5: how dump and restore grow with the GPU bytes of one process and with the number of
    processes; where each scenario's image was (disk or tmpfs)."""
    lines = []
    sizes = [s for s in GROWTH_BYTES if s in scenarios]
    if sizes:
        lines += ["", "4. growth with GPU bytes, one process (medians): seconds, GB/s of the driver's checkpoint "
                  "and restore (in-tree: its hooks), the workload's peak resident memory during the dump (its "
                  "growth: what the checkpoint added), the page cache the dump added, our memory preflight's "
                  "figure, the image and where it was"]
        cols = ["GPU GiB", "dump s", "restore s", "ckpt GB/s", "rest GB/s", "peak RSS", "RSS +", "cache +",
                "preflight", "image GiB"]
        lines.append(f"{'scenario / variant':<20}" + "".join(f"{c:>10}" for c in cols) + "  image on")
        for s in sizes:
            for v in variants:
                t, rt = table[(s, v)], rate_table[(s, v)]
                where = sorted({r.get("image_fs", "?") for r in results if r["scenario"] == s and r["variant"] == v})
                vals = [gpu_of[s], t["dump_s"], t["restore_s"], rt["checkpoint"], rt["restore"], t["dump_peak_rss_gib"],
                        t["dump_peak_rss_gib"] - t["dump_rss0_gib"], t["dump_cache_gib"], t["preflight_gib"],
                        t["image_gib"]]
                lines.append(f"{s + ' ' + v:<20}" + "".join(cell(x, 10) for x in vals) + "  " + "/".join(where))
        for v in variants:
            pts = [(gpu_of[s], table[(s, v)]["dump_s"], table[(s, v)]["restore_s"]) for s in sizes]
            pts = [p for p in pts if ok(p[0]) and ok(p[1]) and ok(p[2])]
            if len(pts) >= 2:
                (g0, d0, r0), (g1, d1, r1) = pts[0], pts[-1]
                lines.append(f"  {v}: from {g0:.1f} to {g1:.1f} GiB, x{g1 / g0:.1f} the bytes: dump x{d1 / d0:.1f}, "
                             f"restore x{r1 / r0:.1f}; marginal cost {(d1 - d0) / (g1 - g0):.3f} s/GiB dump, "
                             f"{(r1 - r0) / (g1 - g0):.3f} s/GiB restore")
    procs = [n for n in PROC_COUNTS if f"p{n}" in scenarios]
    if procs:
        lines += ["", "5. growth with processes, 256 MiB each in one tree (medians): the device phases (seconds "
                  "inside the CUDA plugin's hooks), criu dump and restore, and our plugin's own time beyond the "
                  "driver per process (lock, checkpoint, restore; ms)"]
        cols = ["procs", "dev dump", "dev rest", "dump s", "restore s", "own lock", "own ckpt", "own rest"]
        lines.append(f"{'scenario / variant':<20}" + "".join(f"{c:>10}" for c in cols))
        for n in procs:
            for v in variants:
                t = table[(f"p{n}", v)]
                vals = [t["device_dump_s"], t["device_restore_s"], t["dump_s"], t["restore_s"], t["own_lock_ms"],
                        t["own_ckpt_ms"], t["own_restore_ms"]]
                lines.append(f"{'p' + str(n) + ' ' + v:<20}{n:>10}" + "".join(cell(x, 10) for x in vals))
        if len(procs) >= 2:
            a, b = f"p{procs[0]}", f"p{procs[-1]}"
            for v in variants:
                lines.append(f"  {v}: from {procs[0]} to {procs[-1]} processes the device phases grow "
                             f"x{div(table[(b, v)]['device_dump_s'], table[(a, v)]['device_dump_s']):.2f} (dump), "
                             f"x{div(table[(b, v)]['device_restore_s'], table[(a, v)]['device_restore_s']):.2f} (restore)")
    return lines


def plot_growth(table, scenarios, variants, gpu_of, path):
    """Seconds against GPU GiB (one process) and against the number of processes (256 MiB each)."""
    sizes = [s for s in GROWTH_BYTES if s in scenarios]
    procs = [n for n in PROC_COUNTS if f"p{n}" in scenarios]
    panels = []
    if len(sizes) >= 2:
        xs = [gpu_of[s] for s in sizes]
        panels += [("GPU GiB (one process)", xs, sizes, "dump_s", "criu dump, s"),
                   ("GPU GiB (one process)", xs, sizes, "restore_s", "criu restore, s"),
                   ("GPU GiB (one process)", xs, sizes, "dump_peak_rss_gib", "peak resident memory in the dump, GiB")]
    if len(procs) >= 2:
        names = [f"p{n}" for n in procs]
        panels += [("CUDA processes (256 MiB each)", list(procs), names, "device_dump_s", "device phases of dump, s"),
                   ("CUDA processes (256 MiB each)", list(procs), names, "device_restore_s",
                    "device phases of restore, s")]
    plt = pyplot() if panels else None
    if not plt:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    for ax, (xlabel, xs, names, key, title) in zip(axes[0], panels):
        for v in variants:
            pts = [(x, table[(s, v)][key]) for x, s in zip(xs, names) if ok(x) and ok(table[(s, v)][key])]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
                for x, y in pts:
                    ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"plot: {path}")
