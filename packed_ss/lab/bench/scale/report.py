"""bench-scale's report: the targets its numbers are held to, scale.md (the tables, also printed) and the two
plots, latency against rows per cache length and projected tokens/s against batch per schedule."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..report import pyplot

GOALS = {"packed_over_weight_read": 1.25, "packed_over_ar": 1.15, "nonmodel_share": 0.05, "attention_copy_share": 0.5}


def targets(result: dict) -> dict:
    """The issue's GPU targets for NLD-8B, computed from this run: a Packed-SS call at the widest W within 1.25x of
    its weight-read time and 1.15x of the AR call (batch 1, per cache length), non-model time per iteration at
    most 5%, attention at least 50% of copy bandwidth at the longest cache (batch 1, AR call). `applies`: this
    run is the one the targets are for (CUDA, nld-8b, unscaled)."""
    meta = result["meta"]
    packed_rows = 2 * (max(meta["widths"]) + 1)
    calls = []
    for fit in (f for f in result["latency"] if f["batch"] == 1 and "points" in f):
        packed = next((p for p in fit["points"] if p["kind"] == "packed" and p["rows"] == packed_rows), None)
        ar = next((p for p in fit["points"] if p["kind"] == "ar"), None)
        if packed and ar:
            calls.append({"cache_len": fit["cache_len"], "packed_rows": packed_rows, "packed_ms": packed["median_ms"],
                          "weight_read_ms": fit["weight_read_ms"], "ar_ms": ar["median_ms"],
                          "packed_over_weight_read": packed["median_ms"] / fit["weight_read_ms"],
                          "packed_over_ar": packed["median_ms"] / ar["median_ms"]})
    worst = max(result["iterations"], key=lambda r: r["nonmodel_share"], default=None)
    attention = [a for a in result["attention_bandwidth"] if a["batch"] == 1 and a["kind"] == "ar"]
    return {"goals": GOALS, "calls": calls,
            "max_nonmodel_share": None if worst is None else {k: worst[k] for k in ("schedule", "width", "batch",
                                                                                   "nonmodel_share")},
            "attention": attention[0] if attention else None,
            "applies": meta["device"].startswith("cuda") and meta["config"] == "nld-8b" and meta["scale"] == 1}


def _gib(n) -> str:
    return "null" if n is None else f"{n / 2**30:.3f}"


def markdown(result: dict) -> str:
    meta, copy = result["meta"], result["copy_bandwidth"]
    out = [f"Config `{meta['config']}` x {meta['scale']:g} ({', '.join(f'{k} {v}' for k, v in meta['dims'].items())}; "
           f"{meta['parameters'] / 1e6:.1f} M parameters, random weights built in {meta['build_s']:.1f} s), "
           f"{meta['dtype']} on {meta['device']} ({meta['device_name']}, {meta['threads']} thread(s)), "
           f"{meta['mode']} calls, {meta['reps']} reps; {meta.get('elapsed_s', float('nan')):.0f} s, load average "
           f"{meta['loadavg_start']:.2f} at the start, {meta.get('loadavg_end', float('nan')):.2f} at the end.", "",
           f"`{meta['command']}`", "",
           f"Copy bandwidth (read + write of a {copy['bytes'] >> 20} MiB device-to-device copy): "
           f"{copy['gb_per_s']:.1f} GB/s.", "", "## Per-call latency", ""]
    for fit in result["latency"]:
        if "skipped" in fit:
            out += [f"Cache {fit['cache_len']}, batch {fit['batch']}: skipped ({fit['skipped']}).", ""]
            continue
        out += [f"Cache {fit['cache_len']}, batch {fit['batch']}: tau {fit['tau_ms']:.4f} ms, delta "
                f"{fit['delta_ms']:.5f} ms/row, RMS residual {fit['rms_residual_ms']:.4f} ms (max "
                f"{100 * fit['max_rel_residual']:.1f}% of a point); weight read at copy bandwidth "
                f"{fit['weight_read_ms']:.4f} ms.", "",
                "| call | rows | median ms | fit ms | MB read | GB/s | % of copy |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {p['kind']} | {p['rows']} | {p['median_ms']:.4f} | {p['fit_ms']:.4f} | {p['bytes'] / 1e6:.2f} "
                f"| {p['gb_per_s']:.1f} | {100 * p['copy_share']:.1f} |" for p in fit["points"]]
        out.append("")
    att = result["attention_bandwidth"]
    if att:
        out += ["Attention's bandwidth: extra K/V bytes over extra time between the shortest and the longest cache:",
                "", "| batch | call | rows | GB/s | % of copy |", "|---:|---|---:|---:|---:|"]
        out += [f"| {a['batch']} | {a['kind']} | {a['rows']} | "
                + ("n/a | n/a |" if a["gb_per_s"] is None else f"{a['gb_per_s']:.1f} | {100 * a['copy_share']:.1f} |")
                for a in att]
    out += ["", "## Decode iteration", "", f"{meta['prompt_len']}-token random prompts, {meta['new_tokens']} new "
            "tokens each; iterations: of one decode (random weights still accept some drafts).", "",
            "| schedule | W | batch | mode | epilogue | iterations | ms/iter | model ms | other ms | other % "
            "| model time from |", "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|"]
    out += [f"| {r['schedule']} | {r['width'] or ''} | {r['batch']} | {r['mode']} | {r['epilogue']} "
            f"| {r['iterations']} | {r['ms_per_iteration']:.3f} | {r['model_ms']:.3f} | {r['nonmodel_ms']:.3f} "
            f"| {100 * r['nonmodel_share']:.1f} | {r['model_time']} |" for r in result["iterations"]]
    proj = result["projection"]
    out += ["", f"## Projected tokens/s ({proj['label']})", ""]
    out += [f"- `{name}`: {s['what']} (widths 1..{s['width']})" for name, s in proj["sources"].items()]
    batches = meta["batch_sizes"]
    for cache_len in meta["cache_lens"]:
        auto = [r for r in proj["rows"] if r["cache_len"] == cache_len and (r["auto"] or r["width"] is None)]
        if not auto:
            continue
        out += ["", f"At {cache_len} cached tokens, the width width=\"auto\" would choose: tok/s (W)", "",
                "| source | schedule | " + " | ".join(f"batch {b}" for b in batches) + " |",
                "|---|---|" + "---:|" * len(batches)]
        for key in dict.fromkeys((r["source"], r["schedule"]) for r in auto):
            cells = {r["batch"]: f"{r['tokens_per_s']:.1f} ({r['width'] or '-'})" for r in auto
                     if (r["source"], r["schedule"]) == key}
            out.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells.get(b, "skipped") for b in batches) + " |")
    mem = result["memory"]
    out += ["", "## Memory per request", "", f"Weights {_gib(mem['weights_bytes'])} GiB in all; K/V "
            f"{mem['kv_bytes_per_token'] / 1024:.1f} KiB per position; stored draft distributions "
            f"{mem['stored_draft_bytes'] / 2**20:.2f} MiB (W = {mem['stored_draft_width']}, T = 1, whole vocabulary)."
            + (f" {mem['note']}." if mem["note"] else ""), "",
            "| batch | cache | weights share GiB | K/V GiB | drafts GiB | total GiB |",
            "|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['batch']} | {r['cache_len']} | {_gib(r['weights'])} | {_gib(r['kv'])} | {_gib(r['stored_drafts'])} "
            f"| {_gib(r['total'])} |" for r in mem["per_request"]]
    out += ["", "| schedule | W | batch | peak GiB per request | graph pools GiB |", "|---|---:|---:|---:|---:|"]
    out += [f"| {m['schedule']} | {m['width'] or ''} | {m['batch']} | {_gib(m['peak_per_request'])} "
            f"| {_gib(m['graph_pool_bytes'])} |" for m in mem["measured"]]
    out += ["", "## Kernels per call (Packed-SS, widest W, batch 1)", "",
            "| mode | per iteration | per call | counted |",
            "|---|---:|---:|---|"]
    out += [f"| {k['mode']} | " + (f"null | null | {k['reason']} |" if k["per_call"] is None else
                                   f"{k['per_iteration']:.1f} | {k['per_call']:.1f} | {k['what']} |")
            for k in result["kernels"]]
    out += ["", "## Targets", "", _targets_markdown(result["targets"])]
    return "\n".join(out) + "\n"


def _targets_markdown(t: dict) -> str:
    g = t["goals"]
    lines = [("These are the GPU targets for NLD-8B; this run " + ("is" if t["applies"] else "is NOT") +
              " that run, so the figures below " + ("decide them." if t["applies"] else "only show the method."))]
    for c in t["calls"]:
        lines.append(f"- cache {c['cache_len']}: Packed-SS call ({c['packed_rows']} rows) {c['packed_ms']:.4f} ms = "
                     f"{c['packed_over_weight_read']:.2f}x its weight-read time "
                     f"(target <= {g['packed_over_weight_read']}) "
                     f"and {c['packed_over_ar']:.2f}x the AR call (target <= {g['packed_over_ar']})")
    if t["max_nonmodel_share"]:
        m = t["max_nonmodel_share"]
        lines.append(f"- non-model time per iteration at most {100 * m['nonmodel_share']:.1f}% ({m['schedule']}, "
                     f"batch {m['batch']}; target <= {100 * g['nonmodel_share']:.0f}%)")
    a = t["attention"]
    if a and a["copy_share"] is not None:
        lines.append(f"- attention at {a['to_cache_len']} cached tokens: {100 * a['copy_share']:.1f}% of copy "
                     "bandwidth "
                     f"(target >= {100 * g['attention_copy_share']:.0f}%)")
    return "\n".join(lines)


def _panels(n: int, width: float):
    """(pyplot, figure, axes) of `n` panels side by side."""
    plt = pyplot()
    fig, axes = plt.subplots(1, max(1, n), figsize=(width * max(1, n), 4), squeeze=False)
    return plt, fig, axes[0]


def _save(plt, fig, axes, title: str, path: Path) -> None:
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(result: dict, path: Path) -> None:
    """Median latency against rows, a panel per batch, a line per cache length (dashed: the fit)."""
    fits = [f for f in result["latency"] if "points" in f]
    batches = sorted({f["batch"] for f in fits})
    plt, fig, axes = _panels(len(batches), 5)
    for ax, batch in zip(axes, batches):
        for fit in (f for f in fits if f["batch"] == batch):
            rows = [p["rows"] for p in fit["points"]]
            line, = ax.plot(rows, [p["median_ms"] for p in fit["points"]], "o", label=f"cache {fit['cache_len']}")
            n = np.linspace(0, max(rows), 50)
            ax.plot(n, fit["tau_ms"] + fit["delta_ms"] * n, "--", color=line.get_color())
        ax.set(xlabel="rows per request per call", ylabel="ms per call (median; dashed: fit)", title=f"batch {batch}")
    meta = result["meta"]
    _save(plt, fig, axes, f"{meta['config']} x {meta['scale']:g}, {meta['device_name']}", path)


def plot_projection(result: dict, path: Path) -> None:
    """Projected tokens/s at the auto width against batch, a panel per profile source, a line per schedule, at the
    shortest cache length."""
    rows = [r for r in result["projection"]["rows"] if r["auto"] or r["width"] is None]
    cache_len = min((r["cache_len"] for r in rows), default=None)
    sources = list(dict.fromkeys(r["source"] for r in rows))
    plt, fig, axes = _panels(len(sources), 4.5)
    for ax, source in zip(axes, sources):
        for schedule in dict.fromkeys(r["schedule"] for r in rows if r["source"] == source):
            pts = sorted((r["batch"], r["tokens_per_s"]) for r in rows if r["source"] == source
                         and r["schedule"] == schedule and r["cache_len"] == cache_len)
            ax.plot(*zip(*pts), "o-", label=schedule)
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="projected tokens/s", title=source)
        ax.set_xticks(result["meta"]["batch_sizes"], [str(b) for b in result["meta"]["batch_sizes"]])
    _save(plt, fig, axes, f"PROJECTION at {cache_len} cached tokens: measured cost x published / given acceptance",
          path)


def write(out: Path, result: dict) -> None:
    """OUT/scale.md (printed too), OUT/latency.png, OUT/projection.png; OUT/scale.json is written as results come."""
    text = markdown(result)
    (out / "scale.md").write_text(text)
    print(text)
    plot_latency(result, out / "latency.png")
    plot_projection(result, out / "projection.png")
    json.loads((out / "scale.json").read_text())      # the incremental file is whole
