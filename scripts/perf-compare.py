#!/usr/bin/env python3
"""Compares ringccl's time per call, from ringccl-perf JSON files (`ringccl-perf ... --json F`).

Two builds, side by side:
  scripts/perf-compare.py BEFORE.json [BEFORE.json ...] -- AFTER.json [AFTER.json ...]
Each side's time for a point is the median over its files (runs of the two builds should
alternate on one machine); the ratio is after / before (> 1: slower), with the spread of each
side's runs, so run-to-run noise can be told from a change.

A run against a machine's baseline (docs/perf/baseline-*.json, docs/PERFORMANCE.md):
  scripts/perf-compare.py --baseline FILE [--tolerance 0.03] RUN.json [RUN.json ...]
Every point of the baseline that the run measured is compared (the run's time: the median over
its files); the exit status is 1, naming each point, when one is slower than the baseline by
more than the tolerance (a fraction: 0.03 is 3 %), had wrong elements or failed. Points of the
baseline the run did not measure are listed, not failed.

A baseline from runs (ringccl's records, each time the median over the files):
  scripts/perf-compare.py --make-baseline OUT.json RUN.json [RUN.json ...]

  scripts/perf-compare.py --self-test     runs this script's own tests

A point is (collective, dtype, op, bytes, in place, processes, CUDA graph); only ringccl's
records count."""
import json
import os
import statistics
import sys
import tempfile
import unittest


def key(r):
    """The point a record measures."""
    return (r["collective"], r["dtype"], r.get("op", "none"), r["bytes"], bool(r["inplace"]),
            r.get("procs", 1), bool(r.get("graph", False)))


def describe(k):
    collective, dtype, op, nbytes, inplace, procs, graph = k
    where = "in place" if inplace else "out of place"
    extra = (f", {procs} processes" if procs > 1 else "") + (", CUDA graph" if graph else "")
    return f"{collective} {dtype} {op} {nbytes} B {where}{extra}"


def ringccl_records(path):
    doc = json.load(open(path))
    return doc, [r for r in doc["records"] if r["lib"] == "ringccl"]


def load(paths):
    """Per file: point -> time (µs) of ringccl's records that have one."""
    runs = []
    for p in paths:
        _, recs = ringccl_records(p)
        runs.append({key(r): r["time_us"] for r in recs if r.get("time_us") is not None})
    return runs


def side_by_side(before_paths, after_paths, out=sys.stdout):
    before, after = load(before_paths), load(after_paths)
    keys = sorted(set.intersection(*(set(r) for r in before + after)),
                  key=lambda k: (k[0], k[1], k[2], k[5], k[6], k[4], k[3]))
    print("| collective | dtype | bytes | in place | before µs (runs) | after µs (runs) | after / before |", file=out)
    print("| --- | --- | ---: | --- | --- | --- | ---: |", file=out)
    worst = None
    for k in keys:
        b = [r[k] for r in before]
        a = [r[k] for r in after]
        ratio = statistics.median(a) / statistics.median(b)
        worst = ratio if worst is None else max(worst, ratio)
        span = lambda v: f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"
        print(f"| {k[0]} | {k[1]} | {k[3]} | {'yes' if k[4] else 'no'} | {span(b)} | {span(a)} | {ratio:.3f} |", file=out)
    if worst is not None:
        print(f"\nlargest after / before: {worst:.3f}", file=out)
    return worst


def check(baseline_path, run_paths, tolerance, out=sys.stdout):
    """Compares the runs with the baseline; returns the problems (empty: the run passes)."""
    _, base = ringccl_records(baseline_path)
    base = {key(r): r for r in base if r.get("time_us") is not None}
    times, wrong, failed = {}, {}, {}
    for p in run_paths:
        _, recs = ringccl_records(p)
        for r in recs:
            k = key(r)
            if r.get("error"):
                failed.setdefault(k, r["error"])
            if r.get("wrong"):
                wrong[k] = wrong.get(k, 0) + r["wrong"]
            if r.get("time_us") is not None:
                times.setdefault(k, []).append(r["time_us"])
    problems, missing = [], []
    print("| point | baseline µs | run µs (files) | run / baseline |", file=out)
    print("| --- | ---: | --- | ---: |", file=out)
    for k in sorted(base, key=lambda k: (k[0], k[1], k[2], k[5], k[6], k[4], k[3])):
        b = base[k]["time_us"]
        if k in failed:
            problems.append(f"{describe(k)}: failed: {failed[k]}")
        if k in wrong:
            problems.append(f"{describe(k)}: {wrong[k]} wrong element(s)")
        if k not in times:
            if k not in failed:
                missing.append(describe(k))
            continue
        t = statistics.median(times[k])
        ratio = t / b
        mark = ""
        if ratio > 1 + tolerance:
            mark = " **slower**"
            problems.append(f"{describe(k)}: {t:.2f} µs against {b:.2f} µs in the baseline "
                            f"(+{(ratio - 1) * 100:.1f} %, tolerance {tolerance * 100:.1f} %)")
        span = f"{t:.2f} ({min(times[k]):.2f}–{max(times[k]):.2f})"
        print(f"| {describe(k)} | {b:.2f} | {span} | {ratio:.3f}{mark} |", file=out)
    if missing:
        print(f"\nnot measured by the run ({len(missing)} point(s) of the baseline):", file=out)
        for m in missing:
            print(f"  {m}", file=out)
    return problems


def make_baseline(out_path, run_paths, note=None):
    """Writes ringccl's records of the runs, each time the median over the files, in the JSON
    format ringccl-perf writes (the first file's meta, the sources in meta.notes)."""
    first = None
    points = {}
    for p in run_paths:
        doc, recs = ringccl_records(p)
        first = first or doc
        for r in recs:
            if r.get("time_us") is None or r.get("error"):
                continue
            points.setdefault(key(r), []).append(r)
    records = []
    for k in sorted(points, key=lambda k: (k[0], k[1], k[2], k[5], k[6], k[4], k[3])):
        rs = points[k]
        rec = dict(rs[0])
        t = statistics.median(r["time_us"] for r in rs)
        scale = rec["time_us"] / t if t else 1.0
        rec["time_us"] = t
        rec["time_us_min"] = min(r["time_us_min"] for r in rs if r.get("time_us_min") is not None)
        rec["time_us_mean"] = statistics.mean(r["time_us_mean"] for r in rs if r.get("time_us_mean") is not None)
        for bw in ("algbw", "busbw"):
            if rec.get(bw) is not None:
                rec[bw] = rec[bw] * scale
        rec["wrong"] = sum(r.get("wrong") or 0 for r in rs)
        rec["samples"] = sum(r.get("samples") or 0 for r in rs)
        records.append(rec)
    meta = dict(first["meta"]) if first else {}
    notes = list(meta.get("notes", []))
    notes.append("baseline: ringccl's records, time_us the median over " +
                 ", ".join(os.path.basename(p) for p in run_paths))
    if note:
        notes.append(note)
    meta["notes"] = notes
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "records": records}, f, indent=1)
        f.write("\n")
    return records


class SelfTest(unittest.TestCase):
    def rec(self, nbytes, t, lib="ringccl", inplace=False, procs=1, wrong=0, error=None, coll="all_reduce"):
        return {"collective": coll, "dtype": "f32", "op": "sum", "root": None, "bytes": nbytes,
                "count": nbytes // 4, "lib": lib, "inplace": inplace, "time_us": t,
                "time_us_min": t, "time_us_mean": t, "algbw": nbytes / t / 1e3 if t else None,
                "busbw": nbytes / t / 1e3 if t else None, "wrong": wrong, "ngpus": 2,
                "graph": False, "samples": 10, "error": error, "procs": procs}

    def write(self, records):
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"meta": {"command": ["ringccl-perf"], "notes": []}, "records": records}, f)
        self.addCleanup(os.remove, path)
        return path

    def quiet(self):
        return open(os.devnull, "w")

    def test_a_run_within_the_tolerance_passes(self):
        base = self.write([self.rec(8, 10.0), self.rec(1 << 20, 20.0), self.rec(8, 9.0, inplace=True)])
        run = self.write([self.rec(8, 10.29), self.rec(1 << 20, 19.0), self.rec(8, 9.1, inplace=True),
                          self.rec(8, 100.0, lib="nccl")])
        with self.quiet() as out:
            self.assertEqual(check(base, [run], 0.03, out), [])

    def test_each_slower_size_is_named(self):
        base = self.write([self.rec(8, 10.0), self.rec(64, 10.0), self.rec(1 << 20, 20.0)])
        run = self.write([self.rec(8, 10.4), self.rec(64, 10.0), self.rec(1 << 20, 21.0)])
        with self.quiet() as out:
            problems = check(base, [run], 0.03, out)
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("all_reduce f32 sum 8 B out of place: 10.40 µs against 10.00", problems[0])
        self.assertIn("1048576 B", problems[1])
        self.assertIn("+5.0 %", problems[1])

    def test_the_median_of_several_runs_counts(self):
        base = self.write([self.rec(8, 10.0)])
        runs = [self.write([self.rec(8, t)]) for t in (9.9, 10.2, 15.0)]
        with self.quiet() as out:
            self.assertEqual(check(base, runs, 0.03, out), [])
            self.assertEqual(len(check(base, runs, 0.01, out)), 1)

    def test_wrong_elements_and_failures_fail_and_missing_points_do_not(self):
        base = self.write([self.rec(8, 10.0), self.rec(64, 10.0), self.rec(512, 10.0),
                           self.rec(8, 10.0, procs=2)])
        run = self.write([self.rec(8, 10.0, wrong=3), self.rec(64, None, error="boom")])
        with self.quiet() as out:
            problems = check(base, [run], 0.03, out)
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("3 wrong element(s)", problems[0])
        self.assertIn("failed: boom", problems[1])

    def test_points_differ_by_processes_and_placement(self):
        base = self.write([self.rec(8, 10.0, procs=2)])
        run = self.write([self.rec(8, 50.0), self.rec(8, 50.0, inplace=True, procs=2),
                          self.rec(8, 10.0, procs=2)])
        with self.quiet() as out:
            self.assertEqual(check(base, [run], 0.03, out), [])

    def test_a_baseline_made_from_runs_is_their_median_and_checks_clean(self):
        runs = [self.write([self.rec(8, t), self.rec(8, 2 * t, lib="nccl")]) for t in (10.0, 12.0, 11.0)]
        fd, out_path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        self.addCleanup(os.remove, out_path)
        records = make_baseline(out_path, runs)
        self.assertEqual([r["time_us"] for r in records], [11.0])
        self.assertAlmostEqual(records[0]["busbw"], 8 / 11.0 / 1e3)
        doc = json.load(open(out_path))
        self.assertEqual(set(doc), {"meta", "records"})
        self.assertTrue(doc["meta"]["notes"][-1].startswith("baseline:"))
        with self.quiet() as out:
            self.assertEqual(check(out_path, runs[2:], 0.03, out), [])
            self.assertEqual(len(check(out_path, runs[1:2], 0.03, out)), 1)

    def test_the_committed_baselines_read(self):
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "perf")
        names = [n for n in os.listdir(here) if n.startswith("baseline-") and n.endswith(".json")]
        self.assertGreaterEqual(len(names), 2, names)
        for n in names:
            path = os.path.join(here, n)
            _, recs = ringccl_records(path)
            self.assertTrue(recs, n)
            for r in recs:
                self.assertGreater(r["time_us"], 0, n)
                self.assertEqual(r["wrong"], 0, n)
            # A baseline passes against itself.
            with self.quiet() as out:
                self.assertEqual(check(path, [path], 0.0, out), [], n)


def main(argv):
    if argv[:1] == ["--self-test"]:
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(SelfTest)
        result = unittest.TextTestRunner(verbosity=2).run(suite)
        return 0 if result.wasSuccessful() else 1
    if argv[:1] == ["--make-baseline"] and len(argv) >= 3:
        records = make_baseline(argv[1], argv[2:])
        print(f"{argv[1]}: {len(records)} point(s)")
        return 0
    if argv[:1] == ["--baseline"] and len(argv) >= 3:
        baseline, rest = argv[1], argv[2:]
        tolerance = 0.03
        if rest[:1] == ["--tolerance"]:
            if len(rest) < 2:
                sys.exit(__doc__)
            tolerance = float(rest[1])
            rest = rest[2:]
        if not rest:
            sys.exit(__doc__)
        problems = check(baseline, rest, tolerance)
        if problems:
            print(f"\n{len(problems)} point(s) worse than {baseline}:")
            for p in problems:
                print(f"  {p}")
            return 1
        print(f"\nno point slower than {baseline} by more than {tolerance * 100:.1f} %")
        return 0
    if "--" not in argv:
        sys.exit(__doc__)
    i = argv.index("--")
    if not argv[:i] or not argv[i + 1:]:
        sys.exit(__doc__)
    side_by_side(argv[:i], argv[i + 1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
