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
    ("restore_cache_gib", None), ("restore_shmem_gib", None), ("restore_shmem_after_gib", None), ("preflight_gib", None), ("own_lock_ms", None), ("own_ckpt_ms", None),
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
    lines += registry_lines(cold)
    lines += cri_lines(cold)
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


# One colour per variant and one for a start from scratch, the same in every figure; the phases of a dump or
# restore, and the parts of an image, have colours of their own that no variant has.
VARIANT_COLORS = {"ours": "#1f77b4", "in-tree": "#ff7f0e", "ours-criu": "#2ca02c", "ours-copy": "#9467bd", "ours-zstd": "#17becf",
                  "in-tree+cuda-criu": "#8c564b"}
SPARE_COLORS = ["#d62728", "#393b79", "#637939", "#843c39"]
START_COLOR = "#7f7f7f"
PHASE_COLORS = {"driver": "#bcbd22", "gpu image": "#17becf", "hooks": "#f7b6d2", "in-tree hooks": "#dbdb8d",
                "criu": "#e5c494"}


def variant_color(v, variants=()):
    if v in VARIANT_COLORS:
        return VARIANT_COLORS[v]
    others = [x for x in variants if x not in VARIANT_COLORS]
    return SPARE_COLORS[(others.index(v) if v in others else 0) % len(SPARE_COLORS)]


def save(fig, plt, path):
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    log(f"plot: {path}")


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
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), constrained_layout=True)
    for ax, (key, title) in zip(axes, panels):
        for v in variants:
            ys = [table[(f"{n}gpu", v)][key] for n in counts]
            ax.plot(counts, ys, marker="o", label=v, color=variant_color(v, variants))
            for n, y in zip(counts, ys):
                if ok(y):
                    ax.annotate(f"{y:.2f}", (n, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.set_xticks(counts)
        ax.set_xlabel("GPUs (one 4 GiB process each)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    save(fig, plt, path)


def first_answer_panels(table, scenarios, variants, cold):
    """The headline's content: per scenario, a group per page-cache state (warm, dropped), each a list of bars
    (label, seconds, colour, hatch, is a start from scratch): each variant's restore to its first answer
    (ready) and the starts from scratch it is measured against."""
    def cold_median(what):
        vals = [c["seconds"] for c in cold if c["what"] == what]
        return statistics.median(vals) if vals else float("nan")

    panels = []
    for s in scenarios:
        if SCENARIOS.get(s, ("",))[0] == "serve":
            warm = [("cold start,\ncompile caches warm", cold_median(f"{s}: cold start, weights in the page cache"),
                     None),
                    ("cold start,\nempty compile caches", cold_median(f"{s}: cold start, empty compile caches"), "//")]
            dropped = [("cold start", cold_median(f"{s}: cold start, page cache dropped"), None)]
        else:
            starts = [table[(s, v)]["start_s"] for v in variants if ok(table[(s, v)]["start_s"])]
            warm = [("cold start", statistics.median(starts) if starts else float("nan"), None)]
            dropped = []
        groups = []
        cached = "image and weights" if SCENARIOS.get(s, ("",))[0] == "serve" else "image"
        for title, key, starts in ((f"{cached} in the page cache", "restore_to_ready_s", warm),
                                   ("page cache dropped (a fresh node)", "restore_cold_to_ready_s", dropped)):
            bars = [(f"restore, {v}", table[(s, v)][key], variant_color(v, variants), None, False) for v in variants]
            if any(ok(b[1]) for b in bars):
                groups.append((f"{s}: {title}", bars + [(n, x, START_COLOR, h, True) for n, x, h in starts]))
        if groups:
            panels.append(groups)
    if any(c["what"].startswith("restore-to-ready, ") for c in cold):  # the coldstart scenario
        bars = [(f"restore, {v}", cold_median(f"restore-to-ready, {v}"), variant_color(v, variants), None, False)
                for v in variants]
        bars += [("cold start,\ncompile caches warm", cold_median("cold start, warm caches"), START_COLOR, None, True),
                 ("cold start,\nempty compile caches", cold_median("cold start, empty caches"), START_COLOR, "//", True)]
        panels.append([("coldstart (torch.compile, 2 GiB): warm page cache", bars)])
    return panels


def plot_first_answer(table, scenarios, variants, cold, path):
    """The headline: restore to the first answer against a start from scratch, per variant, with the page
    cache warm and dropped. Each bar is labelled; no legend."""
    panels = first_answer_panels(table, scenarios, variants, cold)
    plt = pyplot() if panels else None
    if not plt:
        return
    rows = max(len(p) for p in panels)
    # Each row as high as its most bars, so that a bar has one thickness throughout.
    heights = [max(len(p[row][1]) if row < len(p) else 1 for p in panels) + 1.6 for row in range(rows)]
    fig, axes = plt.subplots(rows, len(panels), figsize=(6.8 * len(panels), 0.45 * sum(heights) + 0.4),
                             squeeze=False, constrained_layout=True, gridspec_kw={"height_ratios": heights})
    for col, groups in enumerate(panels):
        top = max(nz(x) for _, bars in groups for _, x, *_ in bars)
        for row in range(rows):
            ax = axes[row][col]
            if row >= len(groups):
                ax.axis("off")
                continue
            title, bars = groups[row]
            bars = [b for b in bars if ok(b[1])]
            start = next((x for _, x, _, h, is_start in bars if is_start and not h), float("nan"))
            ys = list(range(len(bars)))
            for y, (label, x, color, hatch, is_start) in zip(ys, bars):
                # A start with empty compile caches: the start's colour, hatched.
                ax.barh([y], [x], 0.7, color=color, hatch=hatch, edgecolor="white" if hatch else color)
                text = f"{x:.2f} s" if x < 100 else f"{x:.1f} s"
                if not is_start and ok(start) and x > 0:
                    text += (f"  ({start / x:.1f}x faster than the cold start)" if x <= start else
                             f"  ({x / start:.1f}x the cold start's time)")
                ax.annotate(text, (x, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=9)
            ax.set_yticks(ys, [b[0] for b in bars], fontsize=9)
            ax.invert_yaxis()
            ax.set_xlim(0, top * 1.6 or 1)
            ax.set_xlabel("seconds to the first answer (shorter is better)", fontsize=9)
            ax.set_title(title, fontsize=10)
            ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Restore to the first answer against a start from scratch", fontsize=12)
    save(fig, plt, path)


REGISTRY = ": through a registry, "


def registry_lines(cold):
    """--registry: each variant's pull, restore to the first answer, and the layer in the registry."""
    rows = [c for c in cold if REGISTRY in c["what"]]
    if not rows:
        return []
    lines = ["", "through a registry (podman checkpoint image pushed to a registry, pulled by a second store, restored "
             "there with the page cache dropped after the pull), seconds"]
    first = {}  # (scenario, layer compression) -> the first variant's row: the others as ratios to it
    for c in rows:
        ref = first.setdefault((c["what"].split(":", 1)[0], c["layer_compression"]), c)
        ratio = f" ({c['seconds'] / ref['seconds']:.2f}x {ref['variant']}'s)" if ref is not c and ref["seconds"] else ""
        lines.append(f"  {c['what']:<50} pull {c['pull_s']:6.2f} + restore to the first answer {c['ready_s']:6.2f} = "
                     f"{c['seconds']:6.2f}{ratio}; layer {c['layer_gib']:.2f} GiB in the registry ({c['layer_compression']}), "
                     f"{c['image_gib']:.2f} GiB unpacked; checkpoint {c['checkpoint_cmd_s']:.2f}, push {c['push_s']:.2f}, "
                     f"{c['read_gib']:.1f} GiB read from disk by the restore")
    return lines


CRI = ": through the CRI, "


def cri_lines(cold):
    """--cri: each variant's steps through containerd's CRI, from the checkpoint to the first answer."""
    rows = [c for c in cold if CRI in c["what"]]
    if not rows:
        return []
    lines = ["", "through the CRI (containerd 2: CheckpointContainer on node 1, a checkpoint image pushed to a registry, "
             "pulled by node 2 and restored in a new pod there with the page cache dropped after the pull), seconds"]
    for c in rows:
        lines.append(f"  {c['what']:<50} pull {c['pull_s']:6.2f} + StartContainer to the first answer {c['ready_s']:6.2f} "
                     f"= {c['seconds']:6.2f}; CheckpointContainer {c['checkpoint_cmd_s']:.2f} ({c['archive_gib']:.2f} "
                     f"GiB archive), image push {c['image_push_s']:.2f}, StartContainer {c['restore_cmd_s']:.2f}, "
                     f"{c['read_gib']:.1f} GiB read from disk by the restore")
    return lines


def registry_panel(ax, rows, variants):
    """From the pull to the first answer on the second host, per variant: the pull, then the restore (podman's
    --registry and containerd's --cri rows alike)."""
    def label(c):
        if CRI in c["what"]:
            return c["what"].replace(CRI, ": CRI, ")
        return c["what"].replace(REGISTRY, ": podman, ")

    def layer(c):
        if CRI in c["what"]:
            return f"{c['archive_gib']:.1f} GiB uncompressed"
        return f"{c['layer_gib']:.1f} GiB {c['layer_compression']}"

    ys = list(range(len(rows)))
    for y, c in zip(ys, rows):
        color = variant_color(c["variant"], variants)
        ax.barh(y, c["pull_s"], 0.6, color=color, alpha=0.45, hatch="//")
        ax.barh(y, c["ready_s"], 0.6, left=c["pull_s"], color=color)
        ax.annotate(f"{c['seconds']:.2f} s ({layer(c)})", (c["seconds"], y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(ys, [label(c) for c in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(c["seconds"] for c in rows) * 1.45)
    ax.set_title("through a registry: from the pull to the first answer on a second host", fontsize=10)
    ax.set_xlabel("seconds", fontsize=9)
    ax.bar([0], [0], color="grey", alpha=0.45, hatch="//", label="pull (the registry's layers)")  # legend keys only
    ax.bar([0], [0], color="grey", label="restore (CRI: StartContainer), page cache dropped, to the first answer")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def plot_phases(table, rate_table, scenarios, variants, cold, path):
    """The phases behind the headline: dump and restore seconds by phase, the image on disk, ratios against
    the baseline, the phases' rates against the machine's limits, and replicas restored at once against as
    many cold starts. Legends sit beside their axes, never on the data."""
    plt = pyplot()
    if not plt:
        return
    pairs = [(s, v) for s in scenarios for v in variants]
    xs = list(range(len(pairs)))
    ticks = [f"{s}\n{v}" for s, v in pairs]
    t = [table[p] for p in pairs]
    replicas = [c for c in cold if " replicas restored at once" in c["what"] or " cold starts at once" in c["what"]]
    others = [v for v in variants if v != C.BASELINE]
    has_ratios = C.BASELINE in variants and bool(others)
    registry = [c for c in cold if REGISTRY in c["what"] or CRI in c["what"]]
    # A run of only --cri or --registry has no round trips: their panels would be empty.
    trips = any(table[p]["runs"] for p in pairs)
    npanels = (4 + has_ratios) * trips + bool(replicas) + bool(registry)
    if not npanels:
        return
    ncols = min(2, npanels)
    nrows = (npanels + ncols - 1) // ncols
    width = min(12.0, max(5.6, 0.9 * len(pairs) + 1.2, 0.16 * 6 * len(pairs) + 1.2))
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * (width + 2.6), 4.4 * nrows), squeeze=False,
                             constrained_layout=True)
    axes = list(axes.flatten())
    for ax in axes[npanels:]:
        ax.axis("off")
    axes = iter(axes)

    def legend_beside(ax, **kw):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, **kw)

    def stacked(ax, segments, title, totals, ylabel):
        bottom = [0.0] * len(pairs)
        for label, vals, color in segments:
            vals = [nz(x) for x in vals]
            if any(vals):
                ax.bar(xs, vals, 0.6, bottom=bottom, label=label, color=color)
                bottom = [b + x for b, x in zip(bottom, vals)]
        for x, total in zip(xs, totals):
            if ok(total):
                ax.annotate(f"{total:.2f}", (x, total), textcoords="offset points", xytext=(0, 2), ha="center",
                            fontsize=8)
        ax.set_xticks(xs, ticks, fontsize=8)
        ax.set_xlim(-0.6, len(pairs) - 0.4)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)

    def criu_rest(total, parts):
        """CRIU's own work: what the parts leave of the whole (the hooks' seconds come from CRIU's log lines
        and can leave out some of the plugin's, so that the parts add up to the measured whole)."""
        return [max(0.0, nz(x) - sum(nz(p[i]) for p in parts)) for i, x in enumerate(total)]

    def round_trip_panels():
        """Dump and restore by phase, the image on disk, the ratios and the rates: the round trips' panels."""
        # Dump: the driver's checkpoint call, our GPU image's write, the rest of the hooks, CRIU's own work.
        ckpt = [r["checkpoint_s"] for r in t]
        write = [nz(r["write_s"]) for r in t]
        hooks_rest = [max(0.0, nz(r["device_dump_s"]) - nz(c) - w) if ok(c) else 0.0 for r, c, w in zip(t, ckpt, write)]
        intree_hooks = [r["device_dump_s"] if not ok(c) else 0.0 for r, c in zip(t, ckpt)]
        dump_criu = criu_rest([r["dump_s"] for r in t], [ckpt, write, hooks_rest, intree_hooks])
        ax = next(axes)
        stacked(ax, [("the driver's checkpoint call", ckpt, PHASE_COLORS["driver"]),
                     ("GPU image write", write, PHASE_COLORS["gpu image"]),
                     ("the plugin's other work", hooks_rest, PHASE_COLORS["hooks"]),
                     ("in-tree plugin's hooks\n(cuda-checkpoint runs)", intree_hooks, PHASE_COLORS["in-tree hooks"]),
                     ("CRIU's own work", dump_criu, PHASE_COLORS["criu"])],
                "criu dump by phase", [r["dump_s"] for r in t], "seconds")
        top = max([nz(r["dump_s"]) for r in t] + [0.0])
        ax.set_ylim(0, top * 1.12 or 1)
        legend_beside(ax)
        # Restore (warm): our GPU image check, the driver's restore+unlock, the rest of the hooks, CRIU's own work;
        # the restore with the page cache dropped as a marker.
        check = [nz(r["gpu_check_s"]) for r in t]
        unlock = [r["restore_unlock_s"] for r in t]
        rest = [max(0.0, nz(r["device_restore_s"]) - nz(u) - c) if ok(u) else 0.0 for r, u, c in zip(t, unlock, check)]
        intree_r = [r["device_restore_s"] if not ok(u) else 0.0 for r, u in zip(t, unlock)]
        restore_criu = criu_rest([r["restore_s"] for r in t], [check, unlock, rest, intree_r])
        ax = next(axes)
        stacked(ax, [("the driver's restore + unlock", unlock, PHASE_COLORS["driver"]),
                     ("GPU image check", check, PHASE_COLORS["gpu image"]),
                     ("the plugin's other work", rest, PHASE_COLORS["hooks"]),
                     ("in-tree plugin's hooks\n(cuda-checkpoint runs)", intree_r, PHASE_COLORS["in-tree hooks"]),
                     ("CRIU's own work", restore_criu, PHASE_COLORS["criu"])],
                "criu restore by phase (image in the page cache)", [r["restore_s"] for r in t], "seconds")
        cold_r = [r["restore_cold_s"] for r in t]
        pts = [(x, y) for x, y in zip(xs, cold_r) if ok(y)]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="v", color="black", zorder=3,
                       label="whole restore,\npage cache dropped")
            for x, y in pts:
                ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(7, -3), fontsize=8)
        ax.set_ylim(0, max([nz(r["restore_s"]) for r in t] + [nz(y) for y in cold_r] + [0.0]) * 1.12 or 1)
        legend_beside(ax)
        # Image on disk: allocated (CRIU's images and our GPU image; the GPU image files are sparse), apparent size.
        ax = next(axes)
        app = [nz(r["image_gib"]) for r in t]
        alloc = [nz(r["image_alloc_gib"]) for r in t]
        gpu_alloc = [nz(r["gpu_files_alloc_gib"]) for r in t]
        ax.bar(xs, [a - g for a, g in zip(alloc, gpu_alloc)], 0.6, color=PHASE_COLORS["criu"],
               label="allocated: CRIU's images")
        ax.bar(xs, gpu_alloc, 0.6, bottom=[a - g for a, g in zip(alloc, gpu_alloc)], color=PHASE_COLORS["gpu image"],
               label="allocated: the plugin's GPU image")
        ax.bar(xs, app, 0.6, color="none", edgecolor="black", linewidth=0.8, linestyle="--",
               label="apparent size (sparse files)")
        for x, a, b in zip(xs, app, alloc):
            ax.annotate(f"{b:.2f}" + (f" / {a:.2f}" if abs(a - b) > 0.05 else ""), (x, max(a, b)),
                        textcoords="offset points", xytext=(0, 2), ha="center", fontsize=8)
        ax.set_ylim(0, max(app + alloc + [0.0]) * 1.12 or 1)
        ax.set_xticks(xs, ticks, fontsize=8)
        ax.set_xlim(-0.6, len(pairs) - 0.4)
        ax.set_title("image on disk (allocated / apparent)", fontsize=10)
        ax.set_ylabel("GiB", fontsize=9)
        legend_beside(ax)
        # Ratios against the baseline and rates: a bar per variant in its colour, a hatch per scenario.
        hatches = {sc: h for sc, h in zip(scenarios, ["", "//", "..", "xx", "\\\\", "++", "oo", "--"] * 4)}

        def grouped(ax, groups, series, fmt):
            """Bars grouped along x, one per series (label, scenario, variant, values), labelled with their values."""
            w = 0.8 / max(1, len(series))
            for i, (label, sc, v, vals) in enumerate(series):
                pos = [g + (i - (len(series) - 1) / 2) * w for g in range(len(groups))]
                bars = ax.bar(pos, [nz(x) for x in vals], w, color=variant_color(v, variants), hatch=hatches[sc],
                              edgecolor="white", linewidth=0, label=label)
                ax.bar_label(bars, labels=[fmt(x) if ok(x) else "" for x in vals], fontsize=7,
                             rotation=90 if len(series) > 3 else 0, padding=2)
            ax.set_xticks(range(len(groups)), groups, fontsize=8)

        def series_label(sc, v):
            return v if len(scenarios) == 1 else f"{sc}, {v}"

        if has_ratios:
            ax = next(axes)
            metrics = [("dump", "dump_s"), ("image\nallocated", "image_alloc_gib"), ("restore", "restore_s"),
                       ("restore,\ncache dropped", "restore_cold_s"), ("first\nanswer", "restore_to_ready_s")]
            metrics = [m for m in metrics if any(ok(table[(sc, C.BASELINE)][m[1]]) for sc in scenarios)]
            series = [(series_label(sc, v), sc, v, [div(table[(sc, v)][k], table[(sc, C.BASELINE)][k]) for _, k in metrics])
                      for sc in scenarios for v in others]
            grouped(ax, [m[0] for m in metrics], series, lambda x: f"{x:.2f}")
            top = max([1.1] + [x * 1.2 for *_, vals in series for x in vals if ok(x)])
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.annotate(f"{C.BASELINE} = 1", (len(metrics) - 0.5, 1.0), textcoords="offset points", xytext=(0, 3),
                        ha="right", fontsize=8)
            ax.set_ylim(0, top)
            ax.set_title(f"variant / {C.BASELINE} (below 1: faster or smaller)", fontsize=10)
            ax.set_ylabel("ratio", fontsize=9)
            legend_beside(ax)
        # Rates against the machine's limits: phases along x.
        ax = next(axes)
        phases = [("driver\ncheckpoint", "checkpoint"), ("GPU image\nwrite", "write"), ("CRIU's\nown dump", "criu_dump"),
                  ("driver\nrestore", "restore"), ("restore,\nend to end", "restore_e2e"),
                  ("restore cold,\nend to end", "restore_cold_e2e")]
        phases = [p for p in phases if any(ok(rate_table[q][p[1]]) for q in pairs)]
        grouped(ax, [p[0] for p in phases],
                [(series_label(sc, v), sc, v, [rate_table[(sc, v)][k] for _, k in phases]) for sc, v in pairs],
                lambda x: f"{x:.1f}")
        for (label, gbps), style in zip(LIMITS, (":", "--", "-.", (0, (4, 1, 1, 1, 1, 1)))):
            ax.axhline(gbps, color="black", linewidth=0.8, linestyle=style, label=f"limit: {label}, {gbps} GB/s")
        ax.set_yscale("log")  # the disk's ~1.2 GB/s and the writers' ~13 GB/s both stay readable
        top = max([nz(rate_table[q][k]) for q in pairs for _, k in phases] + [g for _, g in LIMITS])
        ax.set_ylim(0.2, top * 3)
        ax.set_title("GB/s of GPU state per phase (in-tree: its hooks), log scale", fontsize=10)
        ax.set_ylabel("GB/s", fontsize=9)
        legend_beside(ax)

    if trips:
        round_trip_panels()
    # Replicas restored at once from one image, against as many cold starts at once.
    if replicas:
        ax = next(axes)
        whats = list(dict.fromkeys(c["what"] for c in replicas))
        vals = [statistics.median(c["seconds"] for c in replicas if c["what"] == w) for w in whats]
        labels, colors = [], []
        for w in whats:
            scenario, what = w.split(": ", 1)
            v = what.rsplit(", ", 1)[-1] if "restored at once" in what else None
            labels.append(f"{scenario}: restore, {v}" if v else f"{scenario}: {what.split(' (')[0]}")
            colors.append(variant_color(v, variants) if v else START_COLOR)
        ys = list(range(len(whats)))
        ax.barh(ys, vals, 0.6, color=colors)
        for y, x in zip(ys, vals):
            ax.annotate(f"{x:.2f} s", (x, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_yticks(ys, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(vals) * 1.2)
        n = whats[0].split(": ", 1)[1].split(" ", 1)[0]
        ax.set_title(f"{n} replicas restored at once from one image, until each has answered", fontsize=10)
        ax.set_xlabel("seconds", fontsize=9)
    if registry:
        registry_panel(next(axes), registry, variants)
    save(fig, plt, path)


def plot(table, rate_table, scenarios, variants, cold, path):
    """NAME.png: the headline (restore to the first answer against a start from scratch); NAME-phases.png
    beside it: the phases, sizes, ratios and rates behind it."""
    plot_first_answer(table, scenarios, variants, cold, path)
    plot_phases(table, rate_table, scenarios, variants, cold, path[:-len(".png")] + "-phases.png")


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
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False, constrained_layout=True)
    for ax, (xlabel, xs, names, key, title) in zip(axes[0], panels):
        for v in variants:
            pts = [(x, table[(s, v)][key]) for x, s in zip(xs, names) if ok(x) and ok(table[(s, v)][key])]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v, color=variant_color(v, variants))
                for x, y in pts:
                    ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    save(fig, plt, path)
