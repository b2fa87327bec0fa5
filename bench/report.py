#!/usr/bin/env python3
"""report.py - benchmark results as data, and the tables and pictures made from them.

  report.py parse RAW_DIR --commit C --machine M   JSON lines of RAW_DIR/*.out -> RAW_DIR/rows.jsonl
  report.py tables [--check]                       bench/results/*.jsonl -> docs/benchmarks.md
  report.py plots OUT_DIR                          bench/results/*.jsonl -> OUT_DIR/*.svg (gnuplot)

A row (one JSON object a line) is one measured figure: bench, path, value, unit, reference,
reference_value, ratio, machine, date, commit; optionally runs (the figure of each run), extra (more
columns, shown in order), limit (true: the reference is the most the path can do, drawn in
ratios.svg) and ttft_ms (series of ttft.svg). Numbers are kept as the text they were written with, so
a table shows a figure exactly as it was measured (0.930 stays 0.930). The standard library only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
PLOTS = os.path.join(ROOT, "bench", "plots")
NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$")


def load_rows(path):
    """Rows of one .jsonl file, numbers as their text."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line, parse_float=str, parse_int=str))
            except ValueError as e:
                sys.exit(f"report.py: {path}:{n}: not a JSON object: {e}")
    return rows


def dump_row(row):
    """One row as a JSON line; text that is a number is written as a number."""

    def enc(v):
        if isinstance(v, str) and NUMBER.match(v):
            return v
        if isinstance(v, list):
            return "[" + ", ".join(enc(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(json.dumps(k) + ": " + enc(x) for k, x in v.items()) + "}"
        return json.dumps(v, ensure_ascii=False)

    return enc(row)


def current(rows):
    """The latest row (by date) of each path, in the order paths first appear."""
    order, latest = [], {}
    for r in rows:
        p = r.get("path")
        if p not in latest:
            order.append(p)
            latest[p] = r
        elif (r.get("date") or "") >= (latest[p].get("date") or ""):
            latest[p] = r
    return [latest[p] for p in order]


def bench_files():
    return sorted(f for f in os.listdir(RESULTS) if f.endswith(".jsonl"))


# ---- parse: the JSON lines the benchmarks print -> rows ----------------------------------------

# (value key, reference value key, unit) in the objects the benchmarks print.
VALUE_KEYS = [("gbps", "reference_gbps", "GB/s"), ("ns_per_chunk", "reference_ns_per_chunk", "ns"),
              ("ns_per_step", "reference_ns_per_step", "ns"), ("rtt_us", "reference_rtt_us", "us"),
              ("mean_ms", "reference_ms", "ms"), ("compress_ms", "raw_ms", "ms"),
              ("ns_per_call", "reference_ns_per_call", "ns")]
# Fields that tell two results of one program apart; they name the row's path.
QUALIFIERS = ["codec", "variant", "workload", "disk", "policy", "mode", "completion", "threads",
              "object_bytes", "objects_per_step", "paths", "context_tokens", "payloads", "alpha",
              "read_bandwidth", "figure", "model", "batch", "keys", "integrity", "encrypt",
              "tier", "page_bytes"]


def size_text(n):
    n = int(n)
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n >> 10} KiB"


def redis_row(o, rows, out, base):
    """kvs-bench-redis prints a result twice, once per reference (tcp_stream, redis_benchmark): one
    row each for its op, mode and size, the TCP stream its reference (the limit), redis-benchmark's
    figure and ratio in extra."""
    op = o["bench"][len("redis_"):]
    key = (op, o.get("mode"), o.get("object_bytes"))
    row = rows.get(key)
    if row is None:
        how = "one put each" if op == "put" else f"get_many of {o.get('batch')}"
        row = dict(base, path=f"{op} {size_text(o['object_bytes'])}, {o.get('mode')}, {how}",
                   value=o.get("gbps"), unit="GB/s", reference=None, reference_value=None,
                   ratio=None, extra={}, raw=[])
        rows[key] = row
        out.append(row)
    if o.get("ref") == "tcp_stream":
        streams = o.get("ref_streams", 1)
        row.update(reference=f"{streams} TCP stream{'s' if streams != 1 else ''} 127.0.0.1 "
                   "(as many as the tier's connections), faster direction",
                   reference_value=o.get("ref_gbps"), ratio=o.get("ratio"), limit=True)
        row["extra"]["rounds"] = f"{o.get('ratio_min')}-{o.get('ratio_max')}"
    elif o.get("ref") == "redis_benchmark":
        note = " (slower than the tier: not a limit)" if float(o.get("ratio") or 0) > 1 else ""
        row["extra"]["redis-benchmark"] = f"{o.get('ref_gbps')} GB/s ({o.get('ref_setting')})"
        row["extra"]["ratio to redis-benchmark"] = f"{o.get('ratio')}{note}"
    row["raw"].append(o)
    # extra's columns in one order whichever line came first
    order = ["rounds", "redis-benchmark", "ratio to redis-benchmark"]
    row["extra"] = {k: row["extra"][k] for k in order if k in row["extra"]}


def parse(raw_dir, commit, machine):
    stamp = os.path.basename(os.path.normpath(raw_dir))
    date = stamp[:10]
    out = []
    for name in sorted(os.listdir(raw_dir)):
        seen = {}
        redis_rows = {}
        if not name.endswith(".out"):
            continue
        with open(os.path.join(raw_dir, name), encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                try:
                    o = json.loads(line, parse_float=str, parse_int=str)
                except ValueError:
                    continue
                if str(o.get("bench", "")).startswith("redis_") and "ref" in o:
                    redis_row(o, redis_rows, out, {"bench": name[:-4]})
                    continue
                quals = [f"{k} {o[k]}" for k in QUALIFIERS if k in o]
                path = ", ".join([str(o.get("bench", "?"))] + quals)
                seen[path] = seen.get(path, 0) + 1
                if seen[path] > 1:  # fields this parser does not know tell them apart: keep both
                    path += f" #{seen[path]}"
                row = {"bench": name[:-4], "path": path}
                for vk, rk, unit in VALUE_KEYS:
                    if vk in o:
                        # kvs-bench-store names its reference's figure ref_<value key>
                        row.update(value=o[vk], unit=unit,
                                   reference_value=o[rk] if rk in o else o.get("ref_" + vk))
                        break
                row["reference"] = o.get("reference", o.get("ref"))
                row["ratio"] = o.get("ratio")
                row.update(machine=machine, date=date, commit=commit, raw=o)
                out.append(row)
        for row in redis_rows.values():
            raw = row.pop("raw")
            row.update(machine=machine, date=date, commit=commit, raw=raw)
    dest = os.path.join(raw_dir, "rows.jsonl")
    with open(dest, "w", encoding="utf-8") as f:
        for r in out:
            f.write(dump_row(r) + "\n")
    print(f"report.py: {len(out)} rows in {os.path.relpath(dest, ROOT)}")


# ---- tables: rows -> the Markdown tables of docs/benchmarks.md ---------------------------------

def cell(v):
    if v is None:
        return ""
    if isinstance(v, list):
        return ", ".join(cell(x) for x in v)
    return str(v).replace("|", "\\|")


def table(rows):
    """One Markdown table: a column only where some row has a figure; the machine, date and commit
    that every row shares are said in the first column's title, the others in columns of their own."""
    shared = {}
    for k in ("machine", "date", "commit"):
        vals = {r.get(k) for r in rows}
        if len(vals) == 1:
            shared[k] = vals.pop()
    said = [f"machine `{shared['machine']}`" if shared.get("machine") else None,
            shared.get("date"),
            f"commit `{shared['commit']}`" if shared.get("commit") else None]
    said = [s for s in said if s]
    cols = [("path" + (" (" + ", ".join(said) + ")" if said else ""), lambda r: r.get("path"))]

    def add(title, get):
        if any(get(r) not in (None, "", []) for r in rows):
            cols.append((title, get))

    add("runs", lambda r: r.get("runs"))
    add("ratio", lambda r: r.get("ratio"))
    add("value", lambda r: None if r.get("value") is None
        else f"{r['value']} {r.get('unit', '')}".strip())
    add("reference", lambda r: r.get("reference"))
    add("reference value", lambda r: None if r.get("reference_value") is None
        else f"{r['reference_value']} {r.get('unit', '')}".strip())
    extra_keys = []
    for r in rows:
        for k in r.get("extra", {}):
            if k not in extra_keys:
                extra_keys.append(k)
    for k in extra_keys:
        add(k, lambda r, k=k: r.get("extra", {}).get(k))
    for k in ("date", "commit", "machine"):
        if k not in shared:
            add(k, lambda r, k=k: r.get(k) if k != "commit" or not r.get(k) else f"`{r[k]}`")
    lines = []
    lines.append("| " + " | ".join(t for t, _ in cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for r in rows:
        lines.append("| " + " | ".join(cell(g(r)) for _, g in cols) + " |")
    return lines


def tables(check):
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    new = doc
    for name in bench_files():
        key = name[:-6]
        rows = current(load_rows(os.path.join(RESULTS, name)))
        begin = f"<!-- bench-report {key} begin: generated from bench/results/{name} -->"
        end = f"<!-- bench-report {key} end -->"
        i, j = new.find(begin), new.find(end)
        if i < 0 or j < i:
            sys.exit(f"report.py: docs/benchmarks.md has no markers for {key}: {begin}")
        body = "\n".join(table(rows))
        new = new[:i + len(begin)] + "\n" + body + "\n" + new[j:]
    if check:
        if new != doc:
            sys.exit("report.py: docs/benchmarks.md differs from bench/results/*.jsonl "
                     "(make bench-report rewrites it)")
        print("report.py: the tables of docs/benchmarks.md are those of bench/results/*.jsonl")
        return
    if new != doc:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"report.py: {len(bench_files())} tables in docs/benchmarks.md"
          + ("" if new != doc else " (unchanged)"))


# ---- plots: rows -> SVG through gnuplot --------------------------------------------------------

def number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def plots(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    ratios, ttft = [], []
    for name in bench_files():
        for r in current(load_rows(os.path.join(RESULTS, name))):
            ratio, label = number(r.get("ratio")), f"{r['bench']}: {r['path']}"
            if r.get("limit") is True and ratio is not None:
                ratios.append((label, ratio))
            elif r.get("limit") is True and isinstance(r.get("runs"), list):
                ratios += [(f"{label}, run {i}", number(v)) for i, v in enumerate(r["runs"], 1)]
            if "ttft_ms" in r:
                t = r["ttft_ms"]
                ttft.append((f"{r['bench']}: {r['path']}", number(t.get("without connector")),
                             number(t.get("with connector")), number(t.get("with connector, best"))))
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "ratios.tsv")
        with open(data, "w", encoding="utf-8") as f:
            for label, ratio in ratios:
                f.write(f"{label}\t{ratio}\n")
        gnuplot("ratios.gp", data, os.path.join(out_dir, "ratios.svg"), len(ratios))
        data = os.path.join(tmp, "ttft.tsv")
        with open(data, "w", encoding="utf-8") as f:
            for label, *vals in ttft:
                f.write(label + "\t" + "\t".join("NaN" if v is None else str(v) for v in vals) + "\n")
        gnuplot("ttft.gp", data, os.path.join(out_dir, "ttft.svg"), len(ttft))
    print(f"report.py: {os.path.relpath(out_dir, ROOT)}/ratios.svg ({len(ratios)} paths), "
          f"ttft.svg ({len(ttft)} settings)")


def gnuplot(script, data, out, n):
    args = ["gnuplot", "-e", f"data='{data}'; out='{out}'; n={n}", os.path.join(PLOTS, script)]
    try:
        subprocess.run(args, check=True)
    except FileNotFoundError:
        sys.exit("report.py: gnuplot is not installed (scripts/install-deps.sh installs gnuplot-nox)")
    except subprocess.CalledProcessError as e:
        sys.exit(f"report.py: gnuplot {script} failed with status {e.returncode}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("parse")
    p.add_argument("raw_dir")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--machine", default="unknown")
    t = sub.add_parser("tables")
    t.add_argument("--check", action="store_true")
    g = sub.add_parser("plots")
    g.add_argument("out_dir")
    a = ap.parse_args()
    if a.cmd == "parse":
        parse(a.raw_dir, a.commit, a.machine)
    elif a.cmd == "tables":
        tables(a.check)
    else:
        plots(a.out_dir)


if __name__ == "__main__":
    main()
