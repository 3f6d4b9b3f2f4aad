#!/usr/bin/env python3
"""Summarises the network proxy's trace (`RINGCCL_DEBUG=trace`: lines `ringccl net-trace T us
rank R lane L WHAT peer P k K bytes B`) of one rank: how long a 2-way transfer's chunks take to
send, how many are in flight when the stream posts one, and how long a credit (a signal
without a chunk) waits between its arrival and its publication to the stream.

    scripts/net-trace.py rank0.log[.gz] ...
"""
import gzip
import re
import statistics as st
import sys

LINE = re.compile(r"ringccl net-trace +([\d.]+) us rank (\d+) lane (\d+) (\w+) peer (\d+) k (\d+) bytes (\d+)")


def events(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        out = []
        for line in f:
            m = LINE.search(line)
            if m:
                out.append((float(m[1]), m[4], int(m[6]), int(m[7])))
    return sorted(out)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def summary(path):
    ev = events(path)
    post = {k: (t, b) for t, w, k, b in ev if w == "post"}
    sent = {k: t for t, w, k, b in ev if w == "sent"}
    header = {k: (t, b) for t, w, k, b in ev if w == "header"}
    published, last = {}, 0
    for t, w, k, b in ev:
        if w == "published":
            for x in range(last + 1, k + 1):
                published[x] = t
            last = max(last, k)
    data_posts = [(t, k) for k, (t, b) in post.items() if b > 0]
    xfer = [sent[k] - t for t, k in data_posts if k in sent]
    in_flight = [sum(1 for t2, k2 in data_posts if t2 <= t and sent.get(k2, float("inf")) > t) for t, k in data_posts]
    credit_wait = [published[k] - t for k, (t, b) in header.items() if b == 0 and k in published]
    print(path)
    if xfer:
        print(f"  chunks sent: {len(xfer)}, post -> sent median {st.median(xfer):.0f} us (p90 {pct(xfer, 0.9):.0f})")
        print(f"  chunks in flight when the stream posts one: mean {st.mean(in_flight):.2f}")
    if credit_wait:
        print(f"  credits: {len(credit_wait)}, arrival -> published in the flag word: median {st.median(credit_wait):.0f} us (p90 {pct(credit_wait, 0.9):.0f})")


for p in sys.argv[1:]:
    summary(p)
