#!/usr/bin/env python3
"""Where PostgreSQL's WAL goes at the ceiling: the bytes each table, TOAST table and index wrote.

Starts one `aptix-bench ceiling --runs 1`, reads the WAL PostgreSQL wrote during SECS seconds of
its pipeline half with `pg_walinspect` (PostgreSQL 15's contrib) and sums each record's length by
the relation its first block belongs to, named from the benchmark's database while it still
exists. Per turn figures divide by the turns the run's JSON reports for its counted window, so
they are estimates; the shares are exact.

Usage: scripts/wal-by-relation.py [--delay 36] [--secs 8] [--bench PATH]
Needs: psql as user postgres on 127.0.0.1 (trust), the right to `CREATE EXTENSION pg_walinspect`
in the `postgres` database, and WAL kept long enough to be read after the window: the script
sets `wal_keep_size` to 2GB for the run and resets it afterwards.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

PSQL = ["psql", "-U", "postgres", "-h", "127.0.0.1", "-AtF", "\t", "-v", "ON_ERROR_STOP=1"]

# Each relation's name, a TOAST table's or its index's with the table it belongs to.
NAMES = """SELECT c.relfilenode, c.relname || coalesce(' of ' || (
             SELECT o.relname FROM pg_class o
             WHERE o.reltoastrelid = c.oid
                OR o.reltoastrelid = (SELECT i.indrelid FROM pg_index i WHERE i.indexrelid = c.oid)
             LIMIT 1), '')
           FROM pg_class c WHERE c.relfilenode <> 0;"""


def q(sql, db="postgres"):
    out = subprocess.run(PSQL + ["-d", db, "-c", sql], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=36.0, help="seconds into the run (pipeline half)")
    ap.add_argument("--secs", type=float, default=8.0, help="window length")
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    ap.add_argument("--bench", default=os.environ.get("APTIX_BENCH", f"{target}/release/aptix-bench"))
    a = ap.parse_args()
    q("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    q("ALTER SYSTEM SET wal_keep_size = '2GB'")
    q("SELECT pg_reload_conf()")
    out_json = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    env = dict(os.environ, RUST_LOG="warn")
    run = subprocess.Popen([a.bench, "ceiling", "--runs", "1", "--json", out_json], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(a.delay)
        db = q("SELECT datname FROM pg_database WHERE datname LIKE 'aptix_bench_%' ORDER BY oid DESC LIMIT 1")
        start = q("SELECT pg_current_wal_lsn()")
        time.sleep(a.secs)
        end = q("SELECT pg_current_wal_lsn()")
        # Named now: the benchmark drops its database when the run ends.
        names = dict(line.split("\t", 1) for line in q(NAMES, db).splitlines() if "\t" in line)
        records = q("SELECT record_length, fpi_length, resource_manager, record_type, block_ref "
                    f"FROM pg_get_wal_records_info('{start}', '{end}')")
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
        q("ALTER SYSTEM RESET wal_keep_size")
        q("SELECT pg_reload_conf()")
    report(records, names, out_json, a.secs)


def report(records, names, out_json, secs):
    size, count, fpi = collections.Counter(), collections.Counter(), collections.Counter()
    for line in records.splitlines():
        length, fpi_length, manager, kind, blocks = (line.split("\t") + [""] * 5)[:5]
        m = re.search(r"rel \d+/\d+/(\d+)", blocks)
        key = names.get(m.group(1), m.group(0)) if m else f"{manager}/{kind}"
        size[key] += int(length)
        count[key] += 1
        fpi[key] += int(fpi_length or 0)
    total = sum(size.values())
    try:
        run = json.load(open(out_json))["benchmarks"]["ceiling"]["runs"][0]
        rate = run["figures"]["pipeline_turns_per_s"] if "figures" in run else None
    except (OSError, KeyError, IndexError, ValueError):
        rate = None
    turns = rate * secs if rate else None
    print(f"{total} bytes of WAL in {secs:.0f} s" + (f", ~{turns:.0f} turns" if turns else ""))
    print(f"{'bytes':>12} {'share':>6} {'per turn':>9} {'records':>8} {'FPI':>9}  relation")
    for key, v in size.most_common(25):
        per_turn = f"{v / turns:9.0f}" if turns else f"{'-':>9}"
        print(f"{v:>12} {100 * v / total:5.1f}% {per_turn} {count[key]:>8} {fpi[key]:>9}  {key}")


if __name__ == "__main__":
    sys.exit(main())
