"""From the runs of `benchmarks.throughput` to records, ratios, targets, a table and a plot.

Units everywhere: examples/s; step times in milliseconds; bytes per local worker step;
memory in MiB; start-up and shutdown in seconds.
"""

from __future__ import annotations

import statistics
from typing import Optional

# ratio name -> (numerator, denominator), each (name, mode) or a tuple of them (the first
# that ran in a round is used); 1 ps + 2 workers unless the name says otherwise
RATIOS = {
    "lowlevel_1ps1w_over_local": (("lowlevel_1ps1w", "comm_reduced"), ("local", "n/a")),
    "lowlevel_1ps1w_over_local_exact": (("lowlevel_1ps1w", "exact"), ("local", "n/a")),
    "lowlevel_over_tf2_pss": (("lowlevel_1ps2w", "comm_reduced"), ("tf2_pss_1ps2w", "n/a")),
    "lowlevel_over_tf2_pss_exact": (("lowlevel_1ps2w", "exact"), ("tf2_pss_1ps2w", "n/a")),
    # sync in comm_reduced mode if it ran, else exact (the trainer may refuse --sync with a
    # communication period), over async comm_reduced
    "sync_over_async": ((("lowlevel_1ps2w_sync", "comm_reduced"), ("lowlevel_1ps2w_sync", "exact")),
                        ("lowlevel_1ps2w", "comm_reduced")),
    "sync_over_async_exact": (("lowlevel_1ps2w_sync", "exact"), ("lowlevel_1ps2w", "exact")),
    "lowlevel_1ps1w_over_classic_exact": (("lowlevel_1ps1w", "exact"), ("classic_1ps1w", "n/a")),
    "lowlevel_over_classic_exact": (("lowlevel_1ps2w", "exact"), ("classic_1ps2w", "n/a")),
}

# target name -> (ratio or figure, ">=" or "<=", bound)
TARGETS = {
    "lowlevel_1ps1w_over_local": (">=", 0.8),
    "lowlevel_1ps1w_over_local_exact": (">=", 0.4),
    "lowlevel_over_tf2_pss": (">=", 2.0),
    "lowlevel_over_tf2_pss_exact": (">=", 1.2),
    "sync_over_async": (">=", 0.8),
    "sync_over_async_exact": (">=", 0.8),
    "ps_byte_imbalance_mlp": ("<=", 1.1),
    "ps_byte_imbalance_cnn": ("<=", 1.1),
    "startup_secs_lowlevel_1ps2w": ("<=", 15.0),
    "startup_secs_lowlevel_1ps2w_exact": ("<=", 15.0),
    "shutdown_secs_lowlevel_1ps2w": ("<=", 5.0),
    "shutdown_secs_lowlevel_1ps2w_exact": ("<=", 5.0),
    "accuracy_drop_comm_reduced": ("<=", 0.01),
}


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(runs: list) -> list:
    """One record per (part, name, mode, width): medians over its successful runs."""
    groups: dict = {}
    for run in runs:
        groups.setdefault((run["part"], run["name"], run["mode"]), []).append(run)
    records = []
    for (part, name, mode), group in groups.items():
        ok = [r for r in group if r.get("ok")]
        base = {k: group[0][k] for k in ("part", "name", "trainer", "mode", "num_ps",
                                         "num_workers", "sync", "hidden_units", "params",
                                         "batch_size", "dataset", "bytes_per_step_analytic")}
        rec = dict(base, runs=len(ok), failed=len(group) - len(ok),
                   skipped=next((r["skipped"] for r in group if r.get("skipped")), None),
                   error=next((r["error"] for r in group if r.get("error")), None))
        rss = {}
        for r in ok:
            for task, mb in (r.get("peak_rss_mb") or {}).items():
                rss[task] = max(mb, rss.get(task, 0))
        eps_runs = [r.get("examples_per_sec") for r in ok]
        rec.update(
            examples_per_sec=_median(eps_runs), examples_per_sec_runs=eps_runs,
            step_ms_p50=_median([r.get("step_ms_p50") for r in ok]),
            step_ms_p90=_median([r.get("step_ms_p90") for r in ok]),
            bytes_per_step=_median([r.get("bytes_per_step") for r in ok]),
            bytes_by_ps_share=_shares(ok),
            peak_rss_mb=max(rss.values()) if rss else None, peak_rss_mb_by_task=rss,
            startup_secs=_median([r.get("startup_secs") for r in ok]),
            startup_import_secs=_median([r.get("startup_import_secs") for r in ok]),
            shutdown_secs=_median([r.get("shutdown_secs") for r in ok]),
            shutdown_note=next((r.get("shutdown_note") for r in ok if r.get("shutdown_note")),
                               None),
            accuracy=_median([r.get("accuracy") for r in ok]),
            global_step=_median([r.get("global_step") for r in ok]),
            measured_steps_per_worker=_median([r.get("measured_steps_per_worker") for r in ok]))
        records.append(rec)
    parts = {"main": 0, "sweep": 1, "accuracy": 2}
    modes = {"n/a": 0, "exact": 1, "comm_reduced": 2}
    return sorted(records, key=lambda r: (parts.get(r["part"], 3), r["trainer"] != "local",
                                          r["params"], r["trainer"], r["num_ps"],
                                          r["num_workers"], r["sync"], modes.get(r["mode"], 3)))


def _shares(runs) -> Optional[dict]:
    total: dict = {}
    for r in runs:
        for ps, b in (r.get("bytes_by_ps") or {}).items():
            total[ps] = total.get(ps, 0) + b
    s = sum(total.values())
    return {ps: round(b / s, 4) for ps, b in sorted(total.items())} if s else None


def imbalance(shares: Optional[dict]) -> Optional[float]:
    """Largest share over the mean share (1.0: perfectly even)."""
    if not shares:
        return None
    return round(max(shares.values()) * len(shares), 4)


def ratios(runs: list, records: list, placement: Optional[dict]) -> dict:
    """Each ratio is the median over rounds of the ratio within a round (same-round pairs
    cancel slow drifts of the machine); None when either side has no successful run."""
    out = {}
    main = [r for r in runs if r["part"] == "main" and r.get("ok") and r.get("examples_per_sec")]
    for key, (num, den) in RATIOS.items():
        per_round = []
        for rnd in sorted({r["round"] for r in main}):
            a, b = _pick(main, rnd, num), _pick(main, rnd, den)
            if a and b:
                per_round.append(a[0]["examples_per_sec"] / b[0]["examples_per_sec"])
        out[key] = round(_median(per_round), 3) if per_round else None
    for kind in ("mlp", "cnn"):
        out[f"ps_byte_imbalance_{kind}"] = (placement or {}).get(kind, {}).get("imbalance")
    for rec in records:
        if rec["part"] == "main" and rec["name"] == "lowlevel_2ps2w":
            out[f"ps_byte_imbalance_mlp_measured_{rec['mode']}"] = imbalance(
                rec["bytes_by_ps_share"])
    plan = [out["ps_byte_imbalance_mlp"], out["ps_byte_imbalance_cnn"]]
    out["ps_byte_imbalance"] = max(plan) if None not in plan else None
    return out


def _pick(runs: list, rnd: int, which) -> list:
    """The runs of round `rnd` of (name, mode) `which`, or of the first of several that ran."""
    for key in (which if isinstance(which[0], tuple) else (which,)):
        found = [r for r in runs if r["round"] == rnd and (r["name"], r["mode"]) == key]
        if found:
            return found
    return []


def targets(ratio: dict, records: list, accuracy: Optional[dict]) -> dict:
    """{name: {value, op, bound, status PASS|FAIL|SKIP}}."""
    values = dict(ratio)
    for rec in records:
        if rec["part"] == "main" and rec["name"] == "lowlevel_1ps2w":
            suffix = "_exact" if rec["mode"] == "exact" else ""
            values[f"startup_secs_lowlevel_1ps2w{suffix}"] = rec["startup_secs"]
            values[f"shutdown_secs_lowlevel_1ps2w{suffix}"] = rec["shutdown_secs"]
    if accuracy:
        values["accuracy_drop_comm_reduced"] = accuracy.get("drop")
    return judge(values, TARGETS)


def judge(values: dict, table: dict) -> dict:
    """Each target of `table` ({name: (">=" or "<=", bound)}) judged on `values`
    ({name: float or None}): {name: {value, op, bound, status PASS|FAIL|SKIP}}, SKIP when
    the figure is missing. Every suite's targets go through this."""
    out = {}
    for key, (op, bound) in table.items():
        v = values.get(key)
        status = ("SKIP" if v is None else
                  "PASS" if (v >= bound if op == ">=" else v <= bound) else "FAIL")
        out[key] = {"value": v, "op": op, "bound": bound, "status": status}
    return out


def _fmt(v, digits=0, scale=1.0):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return f"{v / scale:,.{digits}f}"
    return str(v)


COLUMNS = [("config", "name", None), ("mode", "mode", None), ("ps", "num_ps", 0),
           ("workers", "num_workers", 0), ("sync", "sync", None),
           ("params (M)", "params", (2, 1e6)), ("examples/s", "examples_per_sec", 0),
           ("step p50 ms", "step_ms_p50", 2), ("step p90 ms", "step_ms_p90", 2),
           ("MB/step measured", "bytes_per_step", (3, 1e6)),
           ("MB/step analytic", "bytes_per_step_analytic", (3, 1e6)),
           ("peak RSS MiB (max task)", "peak_rss_mb", 0), ("startup s", "startup_secs", 1),
           ("of which import s", "startup_import_secs", 1),
           ("shutdown s", "shutdown_secs", 1), ("test acc", "accuracy", 3), ("runs", "runs", 0)]


def table(records: list) -> str:
    head = "| " + " | ".join(c[0] for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * len(COLUMNS)]
    for rec in records:
        cells = []
        for _, key, spec in COLUMNS:
            v = rec.get(key)
            if spec is None:
                cells.append(_fmt(v))
            elif isinstance(spec, tuple):
                cells.append(_fmt(v, spec[0], spec[1]))
            else:
                cells.append(_fmt(v, spec))
        if rec.get("skipped"):
            cells[6] = "skipped" if rec["mode"] != "comm_reduced" else "skipped (comm_reduced)"
        elif not rec["runs"]:
            cells[6] = "failed"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_table(tgts: dict) -> str:
    lines = ["| figure | value | target | status |", "|---|---|---|---|"]
    for key, t in tgts.items():
        lines.append(f"| {key} | {_fmt(t['value'], 3)} | {t['op']} {t['bound']:g} | "
                     f"{t['status']} |")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    meta = result["meta"]
    parts = ["# Throughput benchmark\n",
             f"`{meta['command']}` — {meta['date']}, {meta['cpu_count']} cores "
             f"({meta.get('cpu_model', '?')}), TensorFlow {meta.get('tensorflow', '?')}, "
             f"load average {meta.get('loadavg_start')} at start, {meta.get('loadavg_end')} "
             f"at the end, {meta.get('wall_secs', 0):.0f} s in all.\n",
             "MLP 784-H-H-10, batch 128 per worker step, synthetic MNIST-shaped data, Adagrad "
             "0.1. examples/s: all workers, warm-up excluded, median of the rounds; step "
             "times: median over workers' percentiles; MB/step: bytes between one worker and "
             "the ps tasks per local step, measured from the kernel's TCP counters "
             "(analytic: 2 x 4 bytes x parameters / communication period; lowlevel exact "
             "with 1 ps: less, its dense layers' products on the ps, lowlevel/modes/ps_products.py); "
             "peak RSS: VmHWM "
             "of the largest task; startup: first process started to the first step of the "
             "last worker (of which import: until the last task had imported TensorFlow, "
             "its first log line); shutdown: last step to every process gone (none for the "
             "references: their ps never exits).\n"]
    for line in result.get("notes", []):
        parts.append(f"- {line}")
    parts.append("\n## Configurations\n")
    parts.append(table([r for r in result["records"] if r["part"] == "main"]))
    sweep = [r for r in result["records"] if r["part"] == "sweep"]
    if sweep:
        parts.append("\n## Model-size sweep\n")
        parts.append(table(sorted(sweep, key=lambda r: (r["trainer"], r["num_ps"], r["mode"],
                                                       r["params"]))))
    acc = result.get("accuracy")
    if acc:
        parts.append("\n## Accuracy (digits)\n")
        parts.append(accuracy_text(acc))
    parts.append("\n## Ratios and targets\n")
    parts.append(targets_table(result["targets"]))
    extra = {k: v for k, v in result["ratios"].items() if k not in result["targets"]}
    if extra:
        parts.append("\nOther ratios: " + ", ".join(f"{k} = {_fmt(v, 3)}"
                                                    for k, v in extra.items()))
    return "\n".join(parts) + "\n"


def accuracy_text(acc: dict) -> str:
    seeds = acc.get("seeds") or [0]
    lines = [f"lowlevel {acc['config']}, async, {acc['examples']:,} training examples "
             f"({acc['train_steps']} global steps of batch {acc['batch_size']}), digits test "
             f"accuracy, mean over seed(s) {', '.join(map(str, seeds))}:"]
    for mode in ("exact", "comm_reduced"):
        v = acc.get(mode)
        by_seed = acc.get(f"{mode}_by_seed") or []
        each = f" (each: {', '.join(f'{a:.4f}' for a in by_seed)})" if len(by_seed) > 1 else ""
        lines.append(f"- {mode}: " + (f"test accuracy {v:.4f}{each}" if v is not None else
                                      acc.get(f"{mode}_note") or "not run"))
    if acc.get("drop") is not None:
        lines.append(f"- drop (exact - comm_reduced): {acc['drop'] * 100:+.2f} points")
    return "\n".join(lines)


def plot(records: list, path: str) -> None:
    """examples/s against parameters (log-log), one line per trainer/mode, 1 worker."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 - matplotlib.ticker below

    lines: dict = {}
    for rec in records:
        if rec["examples_per_sec"] is None or rec["part"] not in ("main", "sweep"):
            continue
        base = rec["name"].split("_h")[0]
        if base not in ("local", "classic_1ps1w", "lowlevel_1ps1w"):
            continue
        label = base if rec["mode"] == "n/a" else f"{base} ({rec['mode']})"
        lines.setdefault(label, {})[rec["params"]] = rec["examples_per_sec"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in sorted(lines.items()):
        xs = sorted(pts)
        ax.plot([x / 1e6 for x in xs], [pts[x] for x in xs], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.set_xlabel("model parameters (millions; MLP 784-H-H-10)")
    ax.set_ylabel("examples/s (batch 128, warm-up excluded)")
    ax.set_title("Throughput against model size (1 worker; local = in-process)")
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
