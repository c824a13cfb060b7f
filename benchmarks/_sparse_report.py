"""The sparse suite's report: records, ratios, targets and the "Sparse" table (`benchmarks.sparse`).

Units: examples/s; step times in milliseconds; bytes per local worker step; memory in MiB;
start-up in seconds. A ps's state: the bytes of the variables placed on it (`sparse.ps_state_bytes`,
lowlevel only: the chief's graph); its peak RSS is the kernel's VmHWM of the process.
"""

from __future__ import annotations

import statistics

from benchmarks import _report

TRAINERS = ("lowlevel", "lowlevel_dynamic", "classic", "tf2_pss")
# target -> (op, bound): the issue's targets, ratios within one run
TARGETS = {
    "sparse_bytes_over_limit": ("<=", 1.2),
    "sparse_lowlevel_over_classic": (">=", 2.0),
    "sparse_lowlevel_over_tf2_pss": (">=", 2.0),
    "sparse_ps_byte_imbalance": ("<=", 1.1),
    # issue 27: every lowlevel ps peaks at <= RSS_BASE_MIB + RSS_PER_STATE x its state
    "sparse_ps_rss_over_budget": ("<=", 1.0),
    # dynamic tables against static ones: examples/s and test AUC (|difference|)
    "sparse_dynamic_over_static": (">=", 0.8),
    "sparse_dynamic_auc_gap": ("<=", 0.005),
}
RSS_BASE_MIB, RSS_PER_STATE = 512.0, 1.25


def rss_over_budget(peak_rss_mb: dict, state_bytes: dict):
    """max over ps tasks of peak RSS / (RSS_BASE_MIB + RSS_PER_STATE x state), or None.

    `peak_rss_mb`: {task: VmHWM MiB}; `state_bytes`: {ps task: bytes of its variables}.
    """
    vals = [peak_rss_mb[k] / (RSS_BASE_MIB + RSS_PER_STATE * b / 2**20)
            for k, b in (state_bytes or {}).items() if b and k in (peak_rss_mb or {})]
    return round(max(vals), 3) if vals else None


def rss_over_state(peak_rss_mb: dict, state_bytes: dict):
    """max over ps tasks of peak RSS / state (both MiB), or None."""
    vals = [peak_rss_mb[k] / (b / 2**20) for k, b in (state_bytes or {}).items()
            if b and k in (peak_rss_mb or {})]
    return round(max(vals), 2) if vals else None


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(runs: list) -> list:
    """One record per trainer: medians over its successful runs."""
    records = []
    for trainer in TRAINERS:
        group = [r for r in runs if r["trainer"] == trainer]
        ok = [r for r in group if r.get("ok")]
        rss: dict = {}
        for r in ok:
            for task, mb in (r.get("peak_rss_mb") or {}).items():
                rss[task] = max(mb, rss.get(task, 0))
        state = next((r["ps_state_bytes"] for r in ok if r.get("ps_state_bytes")), {})
        by_ps = {k: _median([(r.get("bytes_by_ps") or {}).get(k) for r in ok])
                 for k in sorted({k for r in ok for k in (r.get("bytes_by_ps") or {})})}
        records.append({
            "trainer": trainer, "runs": len(group), "ok": len(ok),
            "error": None if ok or not group else group[-1].get("error", "")[-500:],
            # its first line (a memory limit's "did not fit ..." precedes the logs)
            "error_line": None if ok or not group else
            (group[-1].get("error") or "").strip().split("\n")[0][:300],
            "timeout": bool(group) and not ok and any(r.get("timeout") for r in group),
            **{k: _median([r.get(k) for r in ok]) for k in (
                "examples_per_sec", "step_ms_p50", "step_ms_p90", "bytes_per_step",
                "imbalance", "startup_secs")},
            "bytes_by_ps": by_ps, "peak_rss_mb": rss, "ps_state_bytes": state,
            "ps_rss_over_state": rss_over_state(rss, state),
            "auc": _median([r.get("auc") for r in ok]),
            "dynamic_rows": next((r["dynamic_rows"] for r in ok if r.get("dynamic_rows")), None),
            "memory": _memory(group)})
    return records


def _memory(group: list) -> dict:
    """The runs' memory cgroup: its limit, the highest peak, the kills (bytes; None: no limit)."""
    boxes = [r.get("memory") or {} for r in group]
    peaks = [b.get("peak_bytes") for b in boxes if b.get("peak_bytes")]
    return {"limit_bytes": next((b.get("limit_bytes") for b in boxes if b.get("limit_bytes")),
                                None),
            "peak_bytes": max(peaks) if peaks else None,
            "oom_kills": sum(b.get("oom_kills") or 0 for b in boxes)}


def ratios(runs: list, lim: dict) -> dict:
    """The targets' figures: medians over rounds of within-round ratios (lowlevel's)."""
    def per_round(fn):
        vals = []
        for rnd in sorted({r["round"] for r in runs}):
            by = {r["trainer"]: r for r in runs if r["round"] == rnd and r.get("ok")}
            v = fn(by)
            if v is not None:
                vals.append(v)
        return round(_median(vals), 3) if vals else None

    def over(other, mine="lowlevel"):
        return lambda by: (by[mine]["examples_per_sec"] / by[other]["examples_per_sec"]
                           if mine in by and other in by and
                           by[other].get("examples_per_sec") else None)
    return {
        "sparse_bytes_over_limit": per_round(
            lambda by: by["lowlevel"]["bytes_per_step"] / lim["total"]
            if by.get("lowlevel", {}).get("bytes_per_step") else None),
        "sparse_lowlevel_over_classic": per_round(over("classic")),
        "sparse_lowlevel_over_tf2_pss": per_round(over("tf2_pss")),
        "sparse_ps_byte_imbalance": per_round(lambda by: by.get("lowlevel", {}).get("imbalance")),
        # what raw ids and hash tables cost against the static table
        "sparse_dynamic_over_static": per_round(over("lowlevel", "lowlevel_dynamic")),
        "sparse_dynamic_auc_gap": per_round(
            lambda by: abs(by["lowlevel_dynamic"]["auc"] - by["lowlevel"]["auc"])
            if by.get("lowlevel_dynamic", {}).get("auc") is not None
            and by.get("lowlevel", {}).get("auc") is not None else None),
        "sparse_ps_rss_over_budget": per_round(lambda by: rss_over_budget(
            by.get("lowlevel", {}).get("peak_rss_mb"), by.get("lowlevel", {}).get("ps_state_bytes"))),
    }


def targets(ratio: dict) -> dict:
    """{name: {value, op, bound, status PASS|FAIL|SKIP}} of `TARGETS` (`_report.judge`)."""
    return _report.judge(ratio, TARGETS)


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


def _gib(n) -> str:
    return "-" if not n else f"{n / 2**30:.1f} GiB"


def _memory_table(records: list) -> list:
    """Lines of the memory limits' table: limit, cgroup peak, fit, live rows, test AUC."""
    lines = ["| trainer | run's memory limit | its peak (page cache incl.) | fit | "
             "dynamic live rows | test AUC |", "|---|---|---|---|---|---|"]
    for r in records:
        m, rows = r.get("memory") or {}, r.get("dynamic_rows") or {}
        fit = "no: out of memory" if m.get("oom_kills") else ("yes" if r["ok"] else "-")
        live = f"{sum(rows.values()):,} ({len(rows)} shards)" if rows else "-"
        lines.append(f"| {r['trainer']} | {_gib(m.get('limit_bytes'))} | "
                     f"{_gib(m.get('peak_bytes'))} | {fit} | {live} | "
                     f"{_f(r.get('auc'), '.3f')} |")
    return lines


def markdown(sparse: dict) -> str:
    s, lim = sparse["settings"], sparse["limit"]
    lines = [
        "## Sparse\n",
        f"wide_deep on synthetic_ctr, {s['vocab_size']:,} rows x {s['embedding_dim']} "
        f"({lim['table_bytes'] / 2**20:,.0f} MiB of tables), {s['num_ps']} ps + "
        f"{s['num_workers']} workers async, batch {s['batch_size']}, hidden "
        f"{','.join(map(str, s['hidden_units']))}, Adagrad {s['learning_rate']}; "
        f"{s['steps']} measured steps per worker after {s['warmup_steps']}, "
        f"{s['repeats']} round(s), {sparse['wall_secs']:.0f} s. Limit: "
        f"{lim['total'] / 1e6:.3f} MB/step ({lim['sparse'] / 1e6:.3f} MB of unique rows, "
        f"{lim['unique_ids_per_batch']:.0f} of {lim['ids_per_batch']} ids per batch; "
        f"{lim['dense'] / 1e6:.3f} MB dense).\n",
        "| trainer | examples/s | step p50 ms | MB/step | x limit | MB by ps | ps max/mean "
        "| peak RSS MiB per task | ps state MiB | ps RSS/state | startup s |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sparse["records"]:
        if not r["ok"]:
            why = "timeout" if r["timeout"] else "failed"
            first = r.get("error_line") or ((r["error"] or "").strip().split("\n") or [""])[0]
            lines.append(f"| {r['trainer']} | {why}: {first} | | | | | | | | | |")
            continue
        b, state = r["bytes_per_step"], r.get("ps_state_bytes") or {}
        lines.append(
            f"| {r['trainer']} | {_f(r['examples_per_sec'], ',.0f')} | "
            f"{_f(r['step_ms_p50'], '.1f')} | {_f(b and b / 1e6, '.3f')} | "
            f"{_f(b and b / lim['total'], '.2f')} | "
            f"{', '.join(f'{k} {v / 1e6:.1f}' for k, v in r['bytes_by_ps'].items())} | "
            f"{_f(r['imbalance'], '.3f')} | "
            f"{', '.join(f'{k} {v:,.0f}' for k, v in sorted(r['peak_rss_mb'].items()))} | "
            f"{', '.join(f'{k} {v / 2**20:,.0f}' for k, v in sorted(state.items())) or '-'} | "
            f"{_f(r.get('ps_rss_over_state'), '.2f')} | "
            f"{_f(r['startup_secs'], '.1f')} |")
    lines += ["", *_memory_table(sparse["records"]), "",
              _report.targets_table(sparse["targets"])]
    return "\n".join(lines) + "\n"
