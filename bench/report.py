"""The benchmark's report: its tables and the performance issue's targets, from what
bench/run.py measured (each figure a `summarise`d set of rounds beside its reference)."""
from __future__ import annotations

from lanes import LANES, TRANSLATED


def fmt_ratio(summary: dict) -> str:
    """A measurement's median CPU ratio, with the range of its rounds when they differ."""
    low, high = summary["cpu_range"]
    return f"{summary['cpu_ratio']:.2f}" + (f" ({low:.2f}-{high:.2f})" if high > low else "")


def store_table(more: dict[str, dict], levels, soaks: dict) -> str:
    """CPU per request of each store against the null proxy measured beside it (lanes 1 and 2),
    with the database's and Redis's own CPU per request beside the gateway's."""
    out = ["| store | lane | c | req/s | ÷ null | gateway CPU ms/req | ÷ null (rounds) | PostgreSQL CPU ms/req | "
           "Redis CPU ms/req | p50 ms (streams: first byte) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    side = lambda g, k: f"{g[k]:.3f}" if k in g else "-"
    for store, results in more.items():
        for name, *_ in LANES[:2]:
            for c in levels:
                pair = results.get((name, c))
                if pair:
                    g = pair["subject"]
                    out.append(f"| {store} | {name} | {c} | {g['rps']:.0f} | {pair['rps_ratio']:.2f} | "
                               f"{g['cpu_ms']:.3f} | {fmt_ratio(pair)} | {side(g, 'postgresql_cpu_ms')} | "
                               f"{side(g, 'redis_cpu_ms')} | {g['p50_us'] / 1000:.2f} |")
    for store, (before, after, done) in soaks.items():
        out.append("")
        out.append(f"RSS on {store} over {done:,} requests: {before:.1f} MB -> {after:.1f} MB "
                   f"({(after - before) / before:+.1%})")
    return "\n".join(out)


def targets(gw: dict, log_line: dict | None, more: dict, soaked, soaks: dict, levels) -> str:
    """The performance issue's targets, each a median of ratios taken round by round against the
    reference measured beside it (the null proxy, or for translation the same-format lane)."""
    top, one = max(levels), min(levels)
    l1, l2, l3, l4 = (lane[0] for lane in LANES[:4])
    lines = ["Targets (medians of per-round ratios; the rounds' range in brackets):"]

    def check(label: str, pair: dict | None, limit: float, key: str = "cpu_ratio", higher_is_better: bool = False,
              unit: str = "x", scale=lambda v: v):
        if pair is None:
            lines.append(f"- {label}: not measured")
            return
        value = scale(pair[key])
        ok = value >= limit if higher_is_better else value <= limit
        sign = ">=" if higher_is_better else "<="
        spread = ""
        if key == "cpu_ratio" and unit == "x":
            low, high = pair["cpu_range"]
            spread = f" (rounds {low:.2f}-{high:.2f})"
        lines.append(f"- {label}: {value:.2f}{unit}{spread} (target {sign} {limit}{unit}) {'MET' if ok else 'NOT MET'}")

    check(f"SQLite lane 1 CPU per call, c={top}", gw.get((l1, top)), 1.5)
    check(f"SQLite lane 1 throughput, c={top}", gw.get((l1, top)), 0.65, key="rps_ratio", higher_is_better=True)
    check(f"SQLite lane 1 added p50, c={one}", gw.get((l1, one)), 0.3, key="p50_added_us", unit=" ms",
          scale=lambda us: us / 1000)
    check(f"PostgreSQL + Redis lane 1 gateway CPU per call, c={top}", more.get("postgresql+redis", {}).get((l1, top)),
          2.0)
    check(f"Streams CPU per stream, c={top}", gw.get((l2, top)), 1.3)
    check(f"Streams added time to first byte, c={one}", gw.get((l2, one)), 0.5, key="p50_added_us", unit=" ms",
          scale=lambda us: us / 1000)
    check(f"{l3} CPU vs {l1}, c={top}", gw.get((l3, top)), 1.2)
    check(f"{l4} CPU vs {l2}, c={top}", gw.get((l4, top)), 1.2)
    if log_line is not None:      # rounds of the gateway with the line against the gateway without
        check(f"Per-call log line share of a call's CPU, c={top}", log_line, 5, unit="%",
              scale=lambda ratio: 100 * (1 - 1 / ratio))
    for store, (before, after, done) in [("sqlite", soaked), *soaks.items()]:
        if done:
            growth = 100 * (after - before) / before
            lines.append(f"- RSS growth on {store} over {done:,} calls: {growth:.2f}% (target <= 5%) "
                         f"{'MET' if growth <= 5 else 'NOT MET'}")
    return "\n".join(lines)


def table(gw: dict, levels, soaked) -> str:
    """Every gateway lane against the null proxy (lanes 3 and 4 also against their same-format lane)."""
    out = ["| lane | c | gateway req/s | ÷ null | gateway CPU ms/req | ÷ null (rounds) | p50 ms (streams: first byte) | "
           "+p50 vs null ms | p99 ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, _, _, _, streaming in LANES:
        for c in levels:
            pair = gw.get((name, c))
            if pair is None:
                continue
            g = pair["subject"]
            p99 = f"{g['p99_us'] / 1000:.2f}" if g["p99_us"] is not None else "-"
            if name in TRANSLATED:      # its reference is the gateway's same-format lane; null's is that lane's
                base = gw.get((TRANSLATED[name], c))
                if base is None:
                    continue
                n = base["reference"]
                out.append(f"| {name} | {c} | {g['rps']:.0f} | {g['rps'] / n['rps']:.2f} | {g['cpu_ms']:.3f} | "
                           f"{g['cpu_ms'] / n['cpu_ms']:.2f}; ÷ lane {TRANSLATED[name][0]}: {fmt_ratio(pair)} | "
                           f"{g['p50_us'] / 1000:.2f} | {(g['p50_us'] - n['p50_us']) / 1000:+.2f} | {p99} |")
            else:
                out.append(f"| {name} | {c} | {g['rps']:.0f} | {pair['rps_ratio']:.2f} | {g['cpu_ms']:.3f} | "
                           f"{fmt_ratio(pair)} | {g['p50_us'] / 1000:.2f} | {pair['p50_added_us'] / 1000:+.2f} | "
                           f"{p99} |")
    before, after, done = soaked
    out.append("")
    out.append(f"RSS over {done:,} requests (lane 1, c=50, after warm-up): {before:.1f} MB -> {after:.1f} MB "
               f"({(after - before) / before:+.1%})")
    return "\n".join(out)
