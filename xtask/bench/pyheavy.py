"""W6 for `cargo xtask bench`: allocation-heavy pure Python.

    pyheavy.py ITERATIONS

Each iteration builds and drops lists, dicts and strings (the interpreter's
own allocator, arenas taken and given back), and keeps a little for good,
as a training loop keeps its logged metrics: the heap makes a new high now
and then (some 4 KB an iteration), so `record --stacks` takes a stack with
Python frames in it while most of the work makes none. Prints one line of key=value pairs, as
workload.c does, timing only the work.
"""

import resource
import sys
import time

KEPT = []


def cpu_s():
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def batch(i):
    rows = [{"id": j, "name": "row-%d-%d" % (i, j), "vals": [j, j + 1, j + 2]} for j in range(2000)]
    index = {r["name"]: r for r in rows}
    text = ",".join(r["name"] for r in rows)
    return len(index) + len(text.split(","))


def main():
    iterations = int(sys.argv[1])
    cpu0, flt0 = cpu_s(), minflt()
    t0 = time.monotonic()
    total = 0
    for i in range(iterations):
        total += batch(i)
        KEPT.append(("metric %d %d " % (i, total)) * 200)
    t = time.monotonic() - t0
    print(
        "elapsed_s=%.6f cpu_s=%.6f minflt=%d kept=%d"
        % (t, cpu_s() - cpu0, minflt() - flt0, len(KEPT))
    )


main()
