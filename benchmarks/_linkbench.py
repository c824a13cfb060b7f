"""`python -m benchmarks.throughput --link=RATE[,RATE...]`: throughput behind limited links.

    python -m benchmarks.throughput --link=1gbit --out /tmp/links-1g
    python -m benchmarks.throughput --link=10gbit,1gbit,100mbit --out DIR    # the sweep

Every configuration except `local` runs with each task on its own host of
`lowlevel/testing/netns.py` (a network namespace on a bridge in 198.18.0.0/15) whose link is
limited to the rate both ways (`_links.shape`: tbf on both ends of the host's veth);
`local` runs once per round in one process with no link. Default configurations:
local, classic_1ps1w, lowlevel_1ps1w exact and comm_reduced, tf2_pss_1ps1w (1 ps +
1 worker: the one worker's link and the ps's carry every byte; tf2_pss's coordinator
is a third host). Same model, data, batch and optimiser as the rest of
`benchmarks.throughput`; `--configs`, `--modes`, `--communication_period`,
`--hidden_units`, `--measure_secs`, `--warmup_secs`, `--run_timeout_secs` apply;
`--repeats` defaults to 2 here. Each round runs local once, then every rate (in the
given order) with its configurations shuffled; a figure is the median over rounds, a
ratio the median of its within-round ratios.

Targets (ratios in one run; PASS/FAIL/SKIP, SKIP when the rate was not run):
  comm_reduced_over_local@1gbit      >= 0.8   lowlevel comm_reduced / local
  comm_reduced_over_tf2_pss@1gbit    >= 3.0   lowlevel comm_reduced / TF2 PSS
  exact_over_classic@10gbit          >= 1.2   the link is not the bottleneck
  exact_over_classic@100mbit         >= 0.95  the link is the bottleneck: exact mode
      ships the same bytes per step as classic (within 2 %), so the link caps both at
      the same step rate and the best is a tie; 0.95 allows for the measurement alone
      (the window starts and ends mid-transfer, TCP's sawtooth in a 20 ms queue), not
      for a slower step.

Output in `--out`: results.json ({meta, runs, records, ratios, targets, settings}),
results.md (the link-rate table and the targets), links.png (examples/s against link
rate), runs/ with every process's log.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import time

from absl import app, flags

from benchmarks import _configs, _link_runners, _links, _report, _runners
from lowlevel.outputs import files as lowlevel_files
from lowlevel.testing import netns

FLAGS = flags.FLAGS
CONFIGS = ["local", "classic_1ps1w", "lowlevel_1ps1w", "tf2_pss_1ps1w"]
DEFAULTS = {"repeats": 2}
TARGETS = {
    "comm_reduced_over_local@1gbit": (">=", 0.8),
    "comm_reduced_over_tf2_pss@1gbit": (">=", 3.0),
    "exact_over_classic@10gbit": (">=", 1.2),
    "exact_over_classic@100mbit": (">=", 0.95),
}
# ratio name -> (numerator key, denominator key); "local" is the same at every rate.
RATIOS = {
    "comm_reduced_over_local": ("lowlevel_1ps1w:comm_reduced", "local:n/a"),
    "comm_reduced_over_tf2_pss": ("lowlevel_1ps1w:comm_reduced", "tf2_pss_1ps1w:n/a"),
    "exact_over_classic": ("lowlevel_1ps1w:exact", "classic_1ps1w:n/a"),
}
OVERHEAD = 1.06  # bytes on the wire per byte of tensor: Ethernet/IP/TCP, gRPC framing


def expected_steps_per_sec(cfg: _configs.Config, bits: int, period: int,
                           batch_size: int) -> float:
    """Local steps/s per worker: the prior of `_configs`, or the link's cap if lower.

    The cap: a step moves `analytic_bytes` over the busiest link (the ps's, shared by
    the workers), half each way but one after the other (the parameters come, then
    the gradients go), at `bits`/8 bytes/s with `OVERHEAD`.
    """
    prior = _configs.PRIOR_STEPS_PER_SEC["comm_reduced" if cfg.mode == "comm_reduced"
                                         else cfg.trainer]
    wire = _configs.analytic_bytes(cfg, period, batch_size) * max(1, cfg.num_workers) * OVERHEAD
    cap = bits / 8 / wire if wire else float("inf")
    return min(prior * min(1.0, (_configs.REF_PARAMS / cfg.params) ** 0.8), cap)


def plan(rate: float, warmup_secs: float, measure_secs: float,
         most_warmup: int) -> tuple[int, int]:
    """(warm-up, measured) local steps per worker: the seconds at `rate` steps/s, clamped."""
    warmup = int(min(most_warmup, max(10, rate * warmup_secs)))
    return warmup, int(min(50_000, max(20, rate * measure_secs)))


def ratios(runs: list) -> dict:
    """{"<ratio>@<rate>": median over rounds of the within-round ratio of examples/s}."""
    by = {}
    for r in runs:
        if r.get("ok") and r.get("examples_per_sec"):
            by[(r["round"], r["link"], f"{r['name']}:{r['mode']}")] = r["examples_per_sec"]
    rates = sorted({k[1] for k in by if k[1] != "none"}, key=_links.parse_rate, reverse=True)
    out = {}
    for name, (num, den) in RATIOS.items():
        for rate in rates:
            within = []
            for rnd in sorted({k[0] for k in by}):
                a = by.get((rnd, rate, num))
                b = by.get((rnd, "none" if den == "local:n/a" else rate, den))
                if a and b:
                    within.append(a / b)
            if within:
                out[f"{name}@{rate}"] = round(statistics.median(within), 3)
    return out


def targets(ratio: dict) -> dict:
    """{name: {value, op, bound, status PASS|FAIL|SKIP}} of `TARGETS` (rates as written
    in TARGETS; a ratio measured at a rate written otherwise, e.g. 1000mbit, counts)."""
    canon = {}
    for key, v in ratio.items():
        name, _, rate = key.partition("@")
        canon[f"{name}@{_links.format_rate(_links.parse_rate(rate))}"] = v
    return _report.judge(canon, TARGETS)


def aggregate(runs: list) -> list:
    """One record per (config, mode, link): medians over rounds."""
    groups: dict = {}
    for r in runs:
        if r.get("ok"):
            groups.setdefault((r["name"], r["mode"], r["link"]), []).append(r)
    out = []
    for (name, mode, link), rs in groups.items():
        def med(key):
            vals = [r[key] for r in rs if r.get(key) is not None]
            return statistics.median(vals) if vals else None
        util = [(r.get("link_stats") or {}).get("utilisation") for r in rs]
        util = [u for u in util if u is not None]
        out.append({"name": name, "mode": mode, "link": link, "rounds": len(rs),
                    "examples_per_sec": med("examples_per_sec"),
                    "step_ms_p50": med("step_ms_p50"), "bytes_per_step": med("bytes_per_step"),
                    "link_utilisation": statistics.median(util) if util else None})
    return sorted(out, key=_order)


def _order(rec: dict):
    """local, classic, lowlevel exact, comm_reduced, tf2_pss; fastest link first."""
    trainer = next((i for i, t in enumerate(("local", "classic", "lowlevel", "tf2_pss"))
                    if rec["name"].startswith(t)), 9)
    return trainer, rec["name"], rec["mode"] != "exact", -_bits(rec["link"])


def _bits(link: str) -> int:
    return 0 if link == "none" else _links.parse_rate(link)


def markdown(result: dict) -> str:
    rates = result["settings"]["links"]
    keys = list(dict.fromkeys((r["name"], r["mode"]) for r in result["records"]))
    cell = {(r["name"], r["mode"], r["link"]): r for r in result["records"]}
    head = "| config | mode | " + " | ".join(
        f"{r} examples/s | {r} MB/step | {r} link use" for r in rates) + " |"
    lines = [f"`{result['meta']['command']}`, {result['meta']['date']}, "
             f"{result['meta'].get('wall_secs', 0):.0f} s, load average "
             f"{result['meta']['loadavg_start']} at the start", "", head,
             "|---|---|" + "---:|---:|---:|" * len(rates)]
    for name, mode in keys:
        row = f"| {name} | {mode} |"
        for rate in rates:
            rec = cell.get((name, mode, rate)) or cell.get((name, mode, "none"))
            eps = rec and rec["examples_per_sec"]
            b = rec and rec["bytes_per_step"]
            u = rec and rec["link_utilisation"]
            row += (f" {eps:,.0f} |" if eps else " - |") + (f" {b / 1e6:.2f} |" if b else " - |")
            row += f" {u:.2f} |" if u is not None else " - |"
        lines.append(row)
    lines += ["", "local has no link (one process); link use: the busiest direction of the "
              "busiest link over the measured window / the rate.", "",
              _report.targets_table(result["targets"]), "",
              "other ratios: " + json.dumps({k: v for k, v in result["ratios"].items()
                                             if k not in result["targets"]})]
    return "\n".join(lines) + "\n"


def plot(records: list, rates: list, path: str) -> None:
    """examples/s against link rate (log x), one line per configuration; local dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 - matplotlib.ticker below

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [_links.parse_rate(r) / 1e6 for r in rates]
    lines: dict = {}
    for rec in records:
        if rec["examples_per_sec"] is None:
            continue
        label = rec["name"] if rec["mode"] == "n/a" else f"{rec['name']} ({rec['mode']})"
        if rec["link"] == "none":
            ax.plot(xs, [rec["examples_per_sec"]] * len(xs), "k--", label=f"{label}, no link")
        else:
            lines.setdefault(label, {})[_links.parse_rate(rec["link"]) / 1e6] = \
                rec["examples_per_sec"]
    for label, pts in sorted(lines.items()):
        ax.plot(sorted(pts), [pts[x] for x in sorted(pts)], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(xs, [r.replace("gbit", " Gbit/s").replace("mbit", " Mbit/s").replace(
        "kbit", " kbit/s") for r in rates])
    ax.minorticks_off()
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("link rate, each way (tbf on every host's link)")
    ax.set_ylabel("examples/s (batch 128, warm-up excluded)")
    ax.set_title("Throughput against link rate (1 ps + 1 worker, each on its own host)")
    ax.grid(True, which="both", alpha=0.3)
    if records:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _interrupt(*_):
    raise KeyboardInterrupt("SIGTERM")  # unwinds through every `with Hosts`: nothing left


def main(meta: dict, describe) -> int:
    """Runs the link benchmark with the parsed FLAGS; `meta` as throughput.meta() made it.

    Raises app.UsageError (one line) for a bad rate, --quick, or where namespaces or tc
    are not available.
    """
    if FLAGS.quick:
        raise app.UsageError("--quick does not apply to --link; for a short link run give "
                             "--repeats=1 --measure_secs=2")
    for rate in FLAGS.link:
        try:
            _links.parse_rate(rate)
        except ValueError as e:
            raise app.UsageError(f"--link: {e}")
    if netns.unavailable():
        raise app.UsageError(f"--link: {netns.unavailable()}; run as root")
    if shutil.which("tc") is None:
        raise app.UsageError("--link: needs iproute2's tc command (apt-get install iproute2)")
    for name, value in DEFAULTS.items():
        if not FLAGS[name].present:
            FLAGS[name].value = value
    rates = [_links.format_rate(_links.parse_rate(r)) for r in FLAGS.link]
    hidden = tuple(int(h) for h in FLAGS.hidden_units)
    cfgs = _configs.selected(CONFIGS if FLAGS.configs is None else
                             [c.split(":")[0] for c in FLAGS.configs], list(FLAGS.modes),
                             hidden, FLAGS.configs, "main")
    local = [c for c in cfgs if c.num_ps == 0]
    linked = [c for c in cfgs if c.num_ps]
    out = os.path.abspath(FLAGS.out)
    os.makedirs(out, exist_ok=True)
    shutil.rmtree(os.path.join(out, "runs"), ignore_errors=True)
    signal.signal(signal.SIGTERM, _interrupt)
    total = FLAGS.repeats * (len(local) + len(linked) * len(rates))
    print(f"throughput --link: {', '.join(rates)}; {len(linked)} configuration(s) on "
          f"separate hosts + {len(local)} local, x {FLAGS.repeats} round(s) = {total} runs; "
          f"output in {out}", flush=True)
    result = {"meta": meta, "settings": {"links": rates, "tbf": {
        r: _links.tbf_settings(_links.parse_rate(r)) for r in rates}}}
    runs: list = []
    try:
        _rounds(rates, local, linked, total, runs, result, out, describe)
    except KeyboardInterrupt as e:  # each run's hosts and processes are gone by now
        _write(out, result, runs, final=False)
        print(f"throughput --link: interrupted ({str(e) or 'SIGINT'}) after {len(runs)} of "
              f"{total} runs; no namespace or process of it is left; partial "
              f"{out}/results.json",
              flush=True)
        return 143 if str(e) == "SIGTERM" else 130
    _write(out, result, runs, final=True)
    print("\n" + markdown(result))
    print(f"throughput --link: {sum(1 for r in runs if r.get('ok'))} of {len(runs)} runs ok "
          f"in {result['meta']['wall_secs']:.0f} s; {out}/results.json, results.md, links.png",
          flush=True)
    return 0


def _rounds(rates, local, linked, total, runs, result, out, describe) -> None:
    measured, rng, count = {}, random.Random(FLAGS.seed), 0
    for rnd in range(FLAGS.repeats):
        todo = [(c, "none") for c in local]
        for rate in rates:
            order = list(linked)
            rng.shuffle(order)
            todo += [(c, rate) for c in order]
        for cfg, rate in todo:
            count += 1
            bits = _links.parse_rate(rate) if rate != "none" else 10**12
            key = (cfg.key, rate)
            warmup, steps = plan(measured.get(key) or expected_steps_per_sec(
                cfg, bits, FLAGS.communication_period, FLAGS.batch_size), FLAGS.warmup_secs,
                FLAGS.measure_secs, FLAGS.warmup_steps)
            workdir = os.path.join(out, "runs", f"{count:03d}-{cfg.name}-"
                                   f"{cfg.mode.replace('/', '')}-{rate}")
            os.makedirs(workdir)
            runner = _link_runners.OnHosts(bits) if cfg.num_ps else _runners
            t0 = time.monotonic()
            res = _configs.run_config(cfg, warmup, steps, workdir, FLAGS.batch_size,
                                      FLAGS.learning_rate, FLAGS.communication_period,
                                      FLAGS.run_timeout_secs, FLAGS.lowlevel_flags or (),
                                      runners=runner)
            stats = res.pop("link", None)
            run = dict(res, name=cfg.name, mode=cfg.mode, link=rate, round=rnd,
                       num_ps=cfg.num_ps, num_workers=cfg.num_workers, params=cfg.params,
                       warmup_steps=warmup, measured_steps_per_worker=steps)
            if stats:
                run["link_stats"] = stats
            if run.get("ok") and run.get("examples_per_sec"):
                measured[key] = run["examples_per_sec"] / FLAGS.batch_size / cfg.num_workers
            runs.append(run)
            use = (run.get("link_stats") or {}).get("utilisation")
            print(describe(run, count, total, time.monotonic() - t0) +
                  (f" [{rate}, link use {use:.2f}]" if use is not None else f" [{rate}]"),
                  flush=True)
            _write(out, result, runs, final=False)


def _write(out: str, result: dict, runs: list, final: bool) -> None:
    result.update(runs=runs, records=aggregate(runs), ratios=ratios(runs))
    result["targets"] = targets(result["ratios"])
    if final:
        result["meta"].update(loadavg_end=round(os.getloadavg()[0], 2),
                              wall_secs=round(time.time() - result["meta"]["started_unix"], 1))
    lowlevel_files.write_json(os.path.join(out, "results.json"), result, indent=1)
    if final:
        with open(os.path.join(out, "results.md"), "w") as f:
            f.write(markdown(result))
        plot(result["records"], result["settings"]["links"], os.path.join(out, "links.png"))
