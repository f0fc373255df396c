#!/usr/bin/env python3
"""CPU and wall time per write+fdatasync of one batch, through the page cache and with
direct I/O (O_DIRECT, whole 4 KiB blocks from an aligned buffer, the last partial block
written again by the next write, as crates/log/src/storage.rs's DirectFile does), and
with direct I/O written with RWF_DSYNC (one pwritev2 that returns once the data is
durable, in place of the write and the fdatasync), interleaved ROUNDS times:

    scripts/fsync-direct.py DIR [BATCH_BYTES (default 225000)] [COUNT (default 300)] [ROUNDS (default 3)]

Two CPU figures per batch: the process's own (getrusage), and the whole machine's busy
time from /proc/stat (user, nice, system, irq, softirq; not idle, iowait or steal), which
counts the kernel threads that write the page cache back; it is coarse (10 ms ticks) and
counts whatever else runs, so use it on a quiet machine. DIR should be on the disk the
data directory uses. Figures in docs/durability.md ("Direct I/O").
"""
import mmap
import os
import resource
import sys
import time

ALIGN = 4096


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


def run(path, direct, batch, count, dsync=False):
    if os.path.exists(path):
        os.remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_DIRECT if direct else 0), 0o644)
    span = (batch // ALIGN + 2) * ALIGN
    buf = mmap.mmap(-1, span)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(span))
    pos = 0
    c0, b0, w0 = cpu(), busy(), time.perf_counter()
    try:
        for _ in range(count):
            if direct:
                start = pos // ALIGN * ALIGN
                end = (pos + batch + ALIGN - 1) // ALIGN * ALIGN
                flags = os.RWF_DSYNC if dsync else 0
                n = os.pwritev(fd, [memoryview(buf)[: end - start]], start, flags)
                assert n == end - start
            else:
                n = os.pwrite(fd, memoryview(buf)[:batch], pos)
                assert n == batch
            pos += batch
            if not dsync:
                os.fdatasync(fd)
    finally:
        os.close(fd)
        os.remove(path)
    c1, b1, w1 = cpu(), busy(), time.perf_counter()
    return [(x1 - x0) / count * 1e6 for x0, x1 in ((c0, c1), (b0, b1), (w0, w1))]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    batch, count, rounds = (int(sys.argv[i]) if len(sys.argv) > i else dflt for i, dflt in ((2, 225000), (3, 300), (4, 3)))
    path = os.path.join(d, "fsync-direct.test")
    print(f"{batch}-byte batches, {count} per run; µs per batch")
    for r in range(rounds):
        for direct, dsync in ((False, False), (True, False), (True, True)):
            proc, machine, wall = run(path, direct, batch, count, dsync)
            name = "direct+dsync" if dsync else "direct" if direct else "page cache"
            print(f"round {r + 1} {name:<12} process CPU {proc:7.1f}  machine busy {machine:7.1f}  wall {wall:7.1f}")


if __name__ == "__main__":
    main()
