#!/usr/bin/env python3
"""CPU and wall time per write+fdatasync, appending to a file vs overwriting zeros already
on disk: why the log writer zeroes its segments ahead (crates/log/src/writer.rs,
ZERO_AHEAD; figures in docs/durability.md). Runs the two ways interleaved, ROUNDS times.

    scripts/fsync-zeroed.py DIR [BATCH_BYTES (default 225000)] [COUNT (default 300)] [ROUNDS (default 2)]

DIR should be on the disk the data directory uses. The process's own CPU time is counted
(getrusage), so kernel threads' work (the file system journal) is not.
"""
import os
import resource
import sys
import time


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(path, mode, batch, count):
    buf = os.urandom(batch)
    if os.path.exists(path):
        os.remove(path)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | (os.O_APPEND if mode == "append" else 0))
    try:
        if mode == "zeroed":
            zeros = b"\0" * (1 << 20)
            for _ in range(batch * count // len(zeros) + 1):
                os.write(fd, zeros)
            os.fsync(fd)
        c0, t0 = cpu(), time.monotonic()
        for i in range(count):
            if mode == "zeroed":
                os.pwrite(fd, buf, i * batch)
            else:
                os.write(fd, buf)
            os.fdatasync(fd)
        c1, t1 = cpu(), time.monotonic()
    finally:
        os.close(fd)
        os.remove(path)
    return 1e6 * (c1 - c0) / count, 1e6 * (t1 - t0) / count


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 225000
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    path = os.path.join(d, "fsync-zeroed.tmp")
    for r in range(rounds):
        for mode in ("append", "zeroed"):
            c, w = run(path, mode, batch, count)
            print(f"round {r + 1} {batch:8d} B {mode:7s} cpu/fsync {c:8.1f} us  wall/fsync {w:8.1f} us")


if __name__ == "__main__":
    main()
