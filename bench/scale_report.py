"""bench/scale.py's report: the medians of its runs, the markdown table, the plots against world size and the
section of bench/RESULTS.md. Pure functions of the runs (``python bench/scale.py --from-json`` redraws them all).
"""

from __future__ import annotations

import os
import statistics
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ("horovod-py", "torch-gloo")
SECTION = "## Scale across world sizes (one host)"
BEGIN, END = "<!-- bench/scale.py: begin (generated) -->", "<!-- bench/scale.py: end -->"

COLUMNS = [  # key, heading, format; every cell is "horovod-py / Gloo"
    ("first_s", "start-up to first result, s", "{:.2f}"),
    ("after_import_s", "of it after the last import, s", "{:.2f}"),
    ("ar4_us", "4 B allreduce, µs", "{:.0f}"),
    ("ar1m_us", "1 MiB allreduce, µs", "{:.0f}"),
    ("step_ms", "200 × 4 KiB step, ms", "{:.1f}"),
    ("threads", "threads / rank", "{:.0f}"),
    ("fds", "fds / rank", "{:.0f}"),
    ("rss_mib", "max RSS / rank, MiB", "{:.0f}"),
    ("cpu_per_op_us", "rank 0 CPU per 4 B op, µs", "{:.0f}"),
]
OURS_ONLY = [  # horovod-py's negotiation
    ("cpu_per_cycle_4b_us", "rank 0 CPU per cycle (4 B loop), µs", "{:.0f}"),
    ("cpu_per_cycle_step_us", "rank 0 CPU per cycle (step loop), µs", "{:.0f}"),
    ("cycles_per_step", "cycles per step", "{:.2f}"),
]
PLOTS = [("startup", "first_s", "start-up to the first result (s)"), ("latency-4b", "ar4_us", "4 B allreduce (µs)"),
         ("allreduce-1mib", "ar1m_us", "1 MiB allreduce (µs)"), ("step", "step_ms", "200 × 4 KiB step (ms)"),
         ("threads", "threads", "OS threads per rank"), ("fds", "fds", "file descriptors per rank"),
         ("rss", "rss_mib", "max RSS per rank (MiB)"), ("cpu-per-cycle", "cpu_per_cycle_4b_us",
                                                        "rank 0 CPU per negotiation cycle, 4 B loop (µs)")]


def medians(runs):
    """{impl: {np: {key: median over the completed runs, "runs": how many}}}."""
    table = {}
    for impl in IMPLS:
        for np_ in sorted({r["np"] for r in runs}):
            done = [r["figures"] for r in runs if r["impl"] == impl and r["np"] == np_ and "error" not in r["figures"]]
            for f in done:
                f["after_import_s"] = f["first_s"] - f["imported_s"]
            keys = {k for f in done for k, v in f.items() if isinstance(v, (int, float))}
            row = {k: statistics.median(f[k] for f in done if k in f) for k in keys}
            table.setdefault(impl, {})[np_] = dict(row, runs=len(done))
    return table


def markdown(table, nps) -> str:
    ours, gloo = (table.get(i, {}) for i in IMPLS)

    def cell(side, np_, key, fmt):
        value = side.get(np_, {}).get(key)
        return "failed" if value is None else fmt.format(value)
    head = ["ranks"] + [h for _, h, _ in COLUMNS] + [h for _, h, _ in OURS_ONLY] + ["runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for np_ in nps:
        cells = [str(np_)] + [f"{cell(ours, np_, k, f)} / {cell(gloo, np_, k, f)}" for k, _, f in COLUMNS]
        cells += [cell(ours, np_, k, f) for k, _, f in OURS_ONLY]
        cells.append(f"{ours.get(np_, {}).get('runs', 0)} / {gloo.get(np_, {}).get('runs', 0)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(table, nps, folder):
    """One figure per cost against np, log axes; the names written, or the reason there are none."""
    import plotting
    plt, why = plotting.pyplot()
    if plt is None:
        for name, _, _ in PLOTS:
            plotting.say_skipped(os.path.join(folder, f"scale-{name}.png"), why)
        return [], why
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, key, label in PLOTS:
        lines = {impl: [(n, table.get(impl, {}).get(n, {}).get(key)) for n in nps] for impl in IMPLS}
        lines = {impl: [(n, v) for n, v in pts if v] for impl, pts in lines.items()}
        if not any(lines.values()):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for impl, pts in lines.items():
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.axvline(os.cpu_count(), color="grey", linestyle=":", label=f"{os.cpu_count()} cores")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(nps, [str(n) for n in nps])
        ax.set_xlabel(f"ranks on one host ({os.cpu_count()} cores)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(folder, f"scale-{name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written, "" if written else "no run completed"


def results_section(meta, text, repeats, plots, why="") -> str:
    """The generated block of bench/RESULTS.md's section: how the figures were made, the table, the plots."""
    v, cores, load = meta["versions"], meta["cores"], meta["load_at_start"][0]
    env = "started as subprocesses with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT"
    ours = (f"ranks {env} (torch's env:// convention, rank 0 serving the rendezvous)"
            if meta.get("launch") == "env" else "`horovodrun -np N`")      # (runs before the option: horovodrun)
    step = ("Gloo's step is DistributedDataParallel's bucketed reducer over the 200 gradients (a backward pass less "
            "the same pass under `no_sync()`), ours 200 async allreduces, then wait" if meta.get("step_peer") == "ddp"
            else "Gloo's step is 200 unbatched async `all_reduce` calls, then wait")
    about = (
        f"`python bench/scale.py {' '.join(meta['argv'])}` on {meta['date']} (commit {meta['commit']}): {cores} cores "
        f"({meta['cpu']}), so oversubscribed above {cores} ranks; 1-minute load average {load:.1f} when it started; "
        f"Python {v['python']}, numpy {v['numpy']}, torch {v.get('torch', '?')}. horovod-py: {ours} "
        f"at default settings, through `horovod.{meta['binding']}`; Gloo: `torch.distributed` ranks {env} "
        f"(`init_method=env://`). {step}. Each cell is horovod-py / Gloo, the median "
        f"of up to {repeats} runs alternating ours then Gloo's (\"runs\" counts those that completed). Times are the "
        f"slowest rank's; start-up is from the launch to the slowest rank's first allreduce result, and \"after the "
        f"last import\" is the part of it after the last rank had imported its framework (numpy and horovod; torch). "
        f"Threads (OS threads, /proc/self/task: ours include numpy's OpenBLAS thread), descriptors and max RSS "
        f"(VmHWM) are the largest over ranks at the end of the job; CPU figures are rank 0's process CPU (every "
        f"thread) over a loop, per op or per negotiation cycle.")
    shown = ", ".join(f"`{os.path.relpath(p, HERE)}`" for p in plots) if plots else f"none ({why})"
    return "\n".join([BEGIN, *textwrap.wrap(about, width=118, break_on_hyphens=False), "", text, "",
                      *textwrap.wrap(f"Plots: {shown}.", width=118), END])


def write_results(path, block) -> None:
    """Replace the generated block of the section (or append the section); text around the block is kept."""
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        end = len(text) if nxt < 0 else nxt + 1
        body = text[start:end]
        if BEGIN in body and END in body:
            body = body[:body.index(BEGIN)] + block + body[body.index(END) + len(END):]
        else:
            body = f"{SECTION}\n\n{block}\n\n"
        text = text[:start] + body + text[end:]
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{block}\n"
    with open(path, "w") as handle:
        handle.write(text)


AB_FIGURES = (("ar4_us", "4 B allreduce, µs", "{:.0f}"), ("ar1m_us", "1 MiB allreduce, µs", "{:.0f}"),
              ("step_ms", "200 × 4 KiB step, ms", "{:.2f}"),
              ("cpu_per_op_us", "rank 0's CPU per 4 B op, µs", "{:.0f}"))


def ab_label(path: str) -> str:
    """The side's name for another checkout (``scale.py --ab``)."""
    return "ab:" + os.path.basename(os.path.abspath(path).rstrip(os.sep))


def ab_summary(runs, nps, other: str) -> str:
    """This checkout against ``other`` (an ``ab:`` side), per np and figure: each side's median over its runs and, in
    brackets, the median of the rounds' own ratios (this / other); a ratio above 1.10 is marked (!)."""
    lines = [f"A/B, this checkout / {other}: each side's median, (the median of the rounds' ratios)",
             "| ranks | " + " | ".join(head for _, head, _ in AB_FIGURES) + " |", "|---|" + "---|" * len(AB_FIGURES)]
    for np_ in nps:
        rounds = {}
        for r in runs:
            if r["np"] == np_ and r["impl"] in (IMPLS[0], other) and "error" not in r["figures"]:
                rounds.setdefault(r["repeat"], {})[r["impl"]] = r["figures"]
        cells = [str(np_)]
        for key, _, fmt in AB_FIGURES:
            pairs = [(d[IMPLS[0]][key], d[other][key]) for d in rounds.values()
                     if IMPLS[0] in d and other in d and key in d[IMPLS[0]] and d[other].get(key)]
            if not pairs:
                cells.append("-")
                continue
            ratio = statistics.median(a / b for a, b in pairs)
            mark = " !" if ratio > 1.1 else ""
            cells.append(f"{fmt.format(statistics.median(a for a, _ in pairs))} / "
                         f"{fmt.format(statistics.median(b for _, b in pairs))} ({ratio:.2f}{mark})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(figures) -> str:
    """One run's line: its figures, or why it has none."""
    if "error" in figures:
        return f"FAILED ({figures['error']}, {figures['wall_s']:.0f} s)"
    if "teardown" in figures:
        return f"ok, but a rank aborted in Gloo's teardown after its figures were in ({figures['wall_s']:.0f} s)"
    return (f"{figures['wall_s']:.1f} s: first result {figures['first_s']:.2f} s, 4 B {figures['ar4_us']:.0f} us, "
            f"1 MiB {figures['ar1m_us']:.0f} us, step {figures['step_ms']:.1f} ms, {figures['threads']:.0f} threads, "
            f"{figures['fds']:.0f} fds, {figures['rss_mib']:.0f} MiB")
