"""The benchmarks' reports: markdown tables of the schedule, any-order and batch-study results, the schedule
benchmark's latency and ratio plots and the batch study's plot (each JSON is the result dictionary itself)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...decode.registry import schedules


def write_results(out: Path, stem: str, result: dict, markdown: str) -> None:
    """OUT/<stem>.json (every record) and OUT/<stem>.md (the tables, also printed): what every benchmark writes."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    print(markdown)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (the `bench` extra)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(method: str, width: int | None, vs: int) -> str:
    return f"{method} W={width}" if width is not None else f"{method} (vs W={vs})"


def _width(row: dict) -> str:
    if row["width"] == "auto":
        return f"auto={row['engine_width']}"
    return str(row["width"]) if row["width"] is not None else f"(vs {row['vs_width']})"


def _ci(c: dict, fmt: str) -> str:
    return f"{c['point']:{fmt}} [{c['lo']:{fmt}}, {c['hi']:{fmt}}]"


def schedules_markdown(result: dict) -> str:
    """bench.md of the schedule benchmark: latency fit, per-temperature comparison and cost-model tables."""
    meta, lat = result["meta"], result["latency"]
    out = [f"Model `{meta['model']}` ({meta['dtype']}, {meta['device']}, {meta['threads']} thread(s)); "
           f"{meta['n_prompts']} HumanEval prompts, {meta['max_new_tokens']} new tokens, "
           f"{meta['samples']} response(s) per prompt at T > 0; load average {meta['loadavg_start']:.2f} at the "
           f"start, {meta['loadavg_end']:.2f} at the end; {meta['elapsed_s']:.0f} s.", ""]
    out += [f"Per-call latency at {lat['cache_len']} cached tokens (cache capacity {lat['capacity']}): "
            f"tau = {lat['tau_ms']:.3f} ms, delta = {lat['delta_ms']:.4f} ms/row, RMS residual "
            f"{lat['rms_residual_ms']:.3f} ms (max {100 * lat['max_rel_residual']:.1f}% of a point).", "",
            "| call | rows | median ms | fit ms |", "|---|---:|---:|---:|"]
    out += [f"| {p['kind']} | {p['rows']} | {p['median_ms']:.3f} | {p['fit_ms']:.3f} |" for p in lat["points"]]
    for t in meta["temperatures"]:
        top_p = f", top-p {meta['top_p']:g}" if t > 0 and meta.get("top_p") else ""
        out += ["", f"### Temperature {t:g}{top_p}", "",
                "| method | W | tokens | NFE | wall s | tok/s | tok/NFE | ms/NFE | non-model % | acc/verify "
                "| tput ratio vs ar [95% CI] | tput ratio vs hf-lookup [95% CI] | tput ratio vs linear [95% CI] "
                "| wall diff ms/resp [95% CI] | tok/NFE ratio | time/NFE ratio |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|---|"]
        for row in result["summary"]:
            if row["temperature"] != t:
                continue
            vs = row.get("vs_linear")
            cmp = ("| baseline | | | |" if vs is None else
                   f"| {_ci(vs['throughput_ratio'], '.3f')} | "
                   f"{_ci({k: 1e3 * v for k, v in vs['wall_diff_s'].items()}, '.1f')} | "
                   f"{_ci(vs['tokens_per_nfe_ratio'], '.3f')} | {_ci(vs['time_per_nfe_ratio'], '.3f')} |")
            out.append(f"| {row['method']} | {_width(row)} "
                       f"| {row['tokens']} | {row['nfe']} | {row['wall_s']:.2f} | {row['throughput']:.1f} "
                       f"| {row['tokens_per_nfe']:.2f} | {row['ms_per_nfe']:.2f} | {100 * row['nonmodel_frac']:.1f} "
                       f"| {row['mean_accepted']:.2f} "
                       f"| {_ci(row['vs_ar']['throughput_ratio'], '.3f') if 'vs_ar' in row else ''} "
                       f"| {_ci(row['vs_hf_lookup']['throughput_ratio'], '.3f') if 'vs_hf_lookup' in row else ''} "
                       + cmp)
        out += ["", "Cost model, per decode iteration after the prefill. Predicted model time = calls x tau + rows "
                "x delta; decode-rate ratios to Linear-SS (tokens/iter over time/iter) from the predicted model "
                "time, the measured model time, and the measured model + non-model time:", "",
                "| schedule | W | calls | rows | tokens/iter | pred model ms | model ms | non-model ms "
                "| ratio: pred | ratio: model | ratio: model + non-model |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in result["cost_model"]:
            if c["temperature"] == t:
                r = c["ratio_vs_linear"]
                out.append(f"| {c['method']} | {_width(c)} | {c['calls_per_iter']} | {c['rows_per_iter']} "
                           f"| {c['tokens_per_iter']:.2f} | {c['pred_model_ms_per_iter']:.2f} "
                           f"| {c['model_ms_per_iter']:.2f} | {c['nonmodel_ms_per_iter']:.2f} "
                           f"| {r['pred']:.3f} | {r['model']:.3f} | {r['wall']:.3f} |")
    same = [r for r in result["records"] if r["same_as_ar"] is not None and r["method"] != "ar"]
    if same:
        out += ["", f"Greedy outputs equal to our `ar` output: {sum(r['same_as_ar'] for r in same)} of {len(same)}.",
                "", "| method | W | equal to our ar | first differing token (the others) |", "|---|---:|---:|---|"]
        for method, width in dict.fromkeys((r["method"], r["width"]) for r in same):
            mine = [r for r in same if (r["method"], r["width"]) == (method, width)]
            at = sorted(r["differs_at"] for r in mine if not r["same_as_ar"])
            out.append(f"| {method} | {'' if width is None else width} | {sum(r['same_as_ar'] for r in mine)} of "
                       f"{len(mine)} | {', '.join(map(str, at)) or '-'} |")
    return "\n".join(out) + "\n"


def plot_latency(lat: dict, path: Path):
    """Median latency per call layout (bars: IQR) against input rows, with the fitted line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for kind in dict.fromkeys(p["kind"] for p in lat["points"]):
        pts = [p for p in lat["points"] if p["kind"] == kind]
        ax.errorbar([p["rows"] for p in pts], [p["median_ms"] for p in pts], yerr=[p["iqr_ms"] / 2 for p in pts],
                    fmt="o", label=kind, capsize=3)
    n = np.linspace(0, max(p["rows"] for p in lat["points"]), 100)
    ax.plot(n, lat["tau_ms"] + lat["delta_ms"] * n, "k--",
            label=f"fit {lat['tau_ms']:.2f} ms + {lat['delta_ms']:.4f} ms x n")
    ax.set_xlabel("input rows per call, n")
    ax.set_ylabel("forward latency per call (ms, median, bars: IQR)")
    ax.set_title(f"Model call latency at {lat['cache_len']} cached tokens (capacity {lat['capacity']})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_ratios(result: dict, path: Path):
    """Per temperature: each method's throughput, tokens/NFE and time/NFE ratios to Linear-SS, with CIs."""
    plt = pyplot()
    temps = result["meta"]["temperatures"]
    metrics = [("throughput_ratio", "throughput ratio\n(tokens/s over Linear-SS tokens/s)"),
               ("tokens_per_nfe_ratio", "tokens/NFE ratio\n(over Linear-SS)"),
               ("time_per_nfe_ratio", "decoder time/NFE ratio\n(s/NFE over Linear-SS s/NFE)")]
    fig, axes = plt.subplots(len(temps), len(metrics), figsize=(5 * len(metrics), 3.6 * len(temps)), squeeze=False)
    for i, t in enumerate(temps):
        rows = [r for r in result["summary"] if r["temperature"] == t and r.get("vs_linear")]
        labels = [_label(r["method"], r["width"], r["vs_width"]) for r in rows]
        x = np.arange(len(rows))
        for j, (key, ylabel) in enumerate(metrics):
            ax = axes[i][j]
            c = [r["vs_linear"][key] for r in rows]
            colors = ["tab:blue" if r["method"] in schedules() else "tab:gray" for r in rows]
            ax.bar(x, [v["point"] - 1 for v in c], bottom=1, color=colors, alpha=0.6)
            ax.errorbar(x, [v["point"] for v in c], yerr=[[v["point"] - v["lo"] for v in c],
                                                          [v["hi"] - v["point"] for v in c]],
                        fmt="none", ecolor="k", capsize=4)
            ax.axhline(1, color="k", lw=0.8, ls="--")
            ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(ylabel, fontsize=9)
            ax.set_title(f"T = {t:g}: vs Linear-SS at the same W", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
    meta = result["meta"]
    fig.suptitle(f"{meta['n_prompts']} HumanEval prompts, {meta['max_new_tokens']} new tokens; blue: our schedules, "
                 f"gray: transformers peers; bars: 95% paired bootstrap CI ({meta['resamples']} resamples)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def any_order_markdown(result: dict) -> str:
    """bench.md of the any-order benchmark: one row per method."""
    meta = result["meta"]
    widths = meta.get("widths", {})
    lines = [f"Any-order schedules, W={meta['width']}, {meta['n_prompts']} HumanEval prompts, "
             f"{meta['max_new_tokens']} new tokens, greedy, {meta['threads']} thread(s); "
             "ratios: paired bootstrap 95% CI against Linear-SS under the same order (LTR for ar / threshold).", "",
             "| method | order | W | tokens/NFE | tok/s | ms/NFE | non-model % | accepted/verify | = serial ref "
             "| = AR greedy | AR token agreement | throughput / ar | throughput / linear | tokens/NFE / linear |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["summary"]:
        vs = r.get("vs_linear")
        ci = (lambda k: _ci(vs[k], ".3f")) if vs else (lambda k: "1")
        acc = "" if r["accepted_per_verify"] is None else f"{r['accepted_per_verify']:.2f}"
        ser = "" if r["same_as_serial"] is None else f"{r['same_as_serial']:.2f}"
        label = r["method"] if r["order"] is None else f"{r['method']}-{r['order']}"
        vs_ar = _ci(r["vs_ar"]["throughput_ratio"], ".3f") if "vs_ar" in r else "1"
        lines.append(f"| {r['method']} | {r['order'] or ''} | {widths.get(label, '')} | "
                     f"{r['tokens_per_nfe']:.3f} | {r['throughput']:.1f} | {r['ms_per_nfe']:.2f} | "
                     f"{100 * r['nonmodel_frac']:.1f} | {acc} | {ser} | {r['same_as_ar']:.2f} | "
                     f"{r['ar_token_agreement']:.3f} | {vs_ar} | {ci('throughput_ratio')} | {ci('tokens_per_nfe_ratio')} |")
    return "\n".join(lines) + "\n"




def _config_label(c: dict) -> str:
    w = f"auto={c['engine_width']}" if c["width"] == "auto" else str(c["width"])
    return f"{c['schedule']} W={w} T={c['temperature']:g}"


def _opt(value, fmt: str) -> str:
    return "" if value is None else f"{value:{fmt}}"


def batch_markdown(result: dict) -> str:
    """batch.md of the batch study: the exactness verdict, then one table per configuration."""
    meta = result["meta"]
    out = [f"Batch study: model `{meta['model']}` ({meta['dtype']}, {meta['device']} {meta['device_name']}"
           f"{', CUDA graphs' if meta['cuda_graph'] else ''}, {meta['threads']} thread(s)); {meta['n_prompts']} "
           f"prompts ({meta['prompts_file'] or 'HumanEval'}, repeated in order if fewer), {meta['max_new_tokens']} "
           f"new tokens, EOS from the model config; {meta['rounds']} round(s), the baseline and every batch size in "
           f"each, order rotated; load average {meta['loadavg_start']:.2f} at the start, {meta['loadavg_end']:.2f} "
           f"at the end; {meta['elapsed_s']:.0f} s.", "",
           f"Speed-up: aggregate throughput over the sequential baseline (`generate` per prompt, one after another), "
           f"95% CI: {meta['interval']}, {meta['resamples']} resamples.", ""]
    batched = [r for r in result["records"] if r["batch_size"] is not None]
    if result["exact"]:
        out.append(f"Exactness: every batched output equals its request's sequential output ({len(batched)} runs x "
                   f"{meta['n_prompts']} requests).")
    else:
        out += ["**EXACTNESS CHECK FAILED**: batched outputs differ from the sequential ones:", ""]
        out += [f"- {line}" for line in result["failures"]]
    for c in result["configs"]:
        rows = [r for r in result["summary"] if all(r[k] == c[k] for k in ("schedule", "width", "temperature"))]
        p = c["prefill"]
        out += ["", f"### {_config_label(c)} ({c['epilogue']} epilogue, {c['mode']} loop)", "",
                f"Prefill probe (`generate` with max_new_tokens=1 per prompt, median of 3; runs alone in every mode): "
                f"{1e3 * p['wall_s']:.1f} ms for all {meta['n_prompts']} prompts, "
                f"{1e3 * p['wall_s'] / meta['n_prompts']:.2f} ms per request. A request's iteration: "
                f"{c['calls_per_iter']} call(s), {c['rows_per_request']} rows."
                + ("" if "model_ms_fit" not in c else
                   f" Model time per iteration against rows per iteration (batch size x "
                   f"{c['rows_per_request']}), least squares: {c['model_ms_fit']['fixed_ms']:.2f} ms + "
                   f"{c['model_ms_fit']['per_row_ms']:.4f} ms x rows."), "",
                "| run | tok/s | speed-up [95% CI] | wall s | iterations | ms/iter | decode ms/iter | model ms/iter "
                "| non-model ms/iter | occupancy | prefill % | tok/iter | tok/NFE | acc/verify | = sequential |",
                "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            run = "sequential" if r["batch_size"] is None else f"batch {r['batch_size']}"
            speed = "baseline" if r["batch_size"] is None else _ci(r["speedup"], ".2f")
            same = "" if r["same_as_sequential"] is None else f"{r['same_as_sequential']}/{r['runs']}"
            out.append(f"| {run} | {r['throughput']:.1f} | {speed} | {r['wall_s']:.3f} | {r['iterations']:.0f} "
                       f"| {r['ms_per_iter']:.2f} | {r['decode_ms_per_iter']:.2f} "
                       f"| {_opt(r['model_ms_per_iter'], '.2f')} | {_opt(r['nonmodel_ms_per_iter'], '.2f')} "
                       f"| {r['occupancy']:.2f} "
                       f"| {100 * r['prefill_share']:.1f} | {r['tokens_per_iter']:.2f} | {r['tokens_per_nfe']:.2f} "
                       f"| {_opt(r['mean_accepted'], '.2f')} | {same} |")
    out += ["", "Per run, means over rounds. ms/iter: wall / batch iterations (prefills excluded from the count, "
            "not from the wall); decode ms/iter: the same without the prefill probe's time; model / non-model "
            "ms/iter: that decode time split by the runtime's model-call clock (eager loop only); occupancy: the "
            "share of slot-iterations that decoded a request, (sequential iterations - joins) / (the batch sizes "
            "summed over iterations: once nothing waits, finished requests leave the batch), where for Linear-SS "
            "each of the N - b requests that joins a running batch runs its first iteration alone (in the wall, "
            "not in the iteration count); "
            "prefill %: the probe's share of the wall; = sequential: rounds whose outputs all equal the baseline's."]
    return "\n".join(out) + "\n"


def plot_batch(result: dict, path: Path):
    """Aggregate throughput and speed-up over the sequential baseline against batch size, per configuration."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = result["meta"]["batch_sizes"]
    for i, c in enumerate(result["configs"]):
        rows = [r for r in result["summary"] if all(r[k] == c[k] for k in ("schedule", "width", "temperature"))]
        seq = next(r for r in rows if r["batch_size"] is None)
        rows = sorted((r for r in rows if r["batch_size"] is not None), key=lambda r: r["batch_size"])
        x, color = [r["batch_size"] for r in rows], f"C{i}"
        left.plot(x, [r["throughput"] for r in rows], "o-", color=color, label=_config_label(c))
        left.axhline(seq["throughput"], color=color, ls="--", lw=1, label=f"{_config_label(c)}: sequential")
        s = [r["speedup"] for r in rows]
        right.errorbar(x, [v["point"] for v in s], yerr=[[v["point"] - v["lo"] for v in s],
                                                         [v["hi"] - v["point"] for v in s]],
                       fmt="o-", color=color, capsize=4, label=_config_label(c))
    right.axhline(1, color="k", lw=0.8, ls="--")
    for ax, ylabel in ((left, "aggregate throughput (tokens/s)"), (right, "speed-up over sequential (95% CI)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    meta = result["meta"]
    fig.suptitle(f"{meta['n_prompts']} prompts, {meta['max_new_tokens']} new tokens, {meta['device']}"
                 f"{' (CUDA graphs)' if meta['cuda_graph'] else ''}, {meta['rounds']} round(s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
