#!/usr/bin/env python3
"""Per-stage latency of blocking calls, from a stage-trace build's files.

Build with `cmake -DGMUX_STAGE_TRACE=ON`, run one client through gmuxd with
GMUX_STAGE_TRACE_DIR=DIR set for both (the worker inherits gmuxd's environment), then:

    python3 scripts/stage-trace.py DIR

Every blocking call that passes all eight stages of src/common/stage_trace.h in order (a
blocking launch + clFinish does) is one sample; the time between consecutive stages is shown
as p50, p90 and mean in microseconds. Calls that skip a stage (answered without the device, or
several clients' stages interleaved) are left out: trace one client at a time.
"""
import glob
import os
import sys

NAMES = {
    0: "ICD call",
    1: "request decoded",
    2: "batch to queue",
    3: "enqueue begins",
    4: "flushed",
    5: "completion",
    6: "reply written",
    7: "ICD has reply",
}


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: stage-trace.py DIR  (the GMUX_STAGE_TRACE_DIR of the run)")
    events = []
    for path in glob.glob(os.path.join(sys.argv[1], "*.stages")):
        with open(path) as f:
            for line in f:
                stage, ns = line.split()
                events.append((int(ns), int(stage)))
    events.sort()
    gaps = {s: [] for s in range(1, 8)}
    total = []
    chain = None
    for ns, stage in events:
        if stage == 0:
            chain = [ns]
        elif chain is not None and stage == len(chain):
            chain.append(ns)
            if stage == 7:
                for s in range(1, 8):
                    gaps[s].append((chain[s] - chain[s - 1]) / 1000)
                total.append((chain[7] - chain[0]) / 1000)
                chain = None
    if not total:
        sys.exit("no call passed all eight stages (a stage-trace build? one client?)")

    def row(name, v):
        v = sorted(v)
        p50, p90 = v[len(v) // 2], v[int(len(v) * 0.9)]
        print(f"{name:<40} {p50:8.2f} {p90:8.2f} {sum(v) / len(v):8.2f}")

    print(f"{len(total)} calls; microseconds")
    print(f"{'stage':<40} {'p50':>8} {'p90':>8} {'mean':>8}")
    for s in range(1, 8):
        row(f"{s - 1}->{s} {NAMES[s - 1]} -> {NAMES[s]}", gaps[s])
    row("total (0->7)", total)


if __name__ == "__main__":
    main()
