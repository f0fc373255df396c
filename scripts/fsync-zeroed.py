#!/usr/bin/env python3
"""CPU and wall time per write+fdatasync of one batch, three ways, interleaved ROUNDS times:

  append     append to the file;
  zeroed     overwrite zeros written (and fsynced) before the timed loop;
  live-zero  how the log writer zeroes ahead (crates/log/src/writer.rs, ZERO_AHEAD):
             whenever a batch would pass the zeros, first extend the file with AHEAD bytes
             of zeros, inside the timed loop, so their writing and the fsync that carries
             them count. The writer itself does this only for batches of at most 64 KiB
             (ZERO_BATCH_MAX) and appends larger ones; this script zeroes for any size, to
             measure both sides of that limit.

    scripts/fsync-zeroed.py DIR [BATCH_BYTES (default 225000)] [COUNT (default 300)] [ROUNDS (default 2)] [AHEAD (default 262144)]

`zeroed` alone overstates zeroing ahead: its zeros cost nothing in the loop. The worst
fsync is printed too, since the one after an extension carries AHEAD bytes of zeros.
DIR should be on the disk the data directory uses. The process's own CPU time is counted
(getrusage), so kernel threads' work is not. Figures in docs/durability.md.
"""
import os
import resource
import sys
import time


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(path, mode, batch, count, ahead):
    buf = os.urandom(batch)
    if os.path.exists(path):
        os.remove(path)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY)
    zeros = b"\0" * min(ahead, 1 << 20)
    zeroed = pos = 0
    worst = 0.0
    try:
        if mode == "zeroed":
            while zeroed < batch * count:
                os.pwrite(fd, zeros, zeroed)
                zeroed += len(zeros)
            os.fsync(fd)
        c0, t0 = cpu(), time.monotonic()
        for _ in range(count):
            s = time.monotonic()
            end = pos + batch
            if mode == "live-zero" and end > zeroed:
                target = end + ahead
                zeroed = max(zeroed, pos)
                while zeroed < target:
                    n = min(len(zeros), target - zeroed)
                    os.pwrite(fd, zeros[:n], zeroed)
                    zeroed += n
            os.pwrite(fd, buf, pos)
            pos = end
            os.fdatasync(fd)
            worst = max(worst, time.monotonic() - s)
        c1, t1 = cpu(), time.monotonic()
    finally:
        os.close(fd)
        os.remove(path)
    return 1e6 * (c1 - c0) / count, 1e6 * (t1 - t0) / count, 1e6 * worst


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 225000
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    ahead = int(sys.argv[5]) if len(sys.argv) > 5 else 262144
    path = os.path.join(d, "fsync-zeroed.tmp")
    for r in range(rounds):
        for mode in ("append", "zeroed", "live-zero"):
            c, w, x = run(path, mode, batch, count, ahead)
            print(f"round {r + 1} {batch:8d} B {mode:9s} cpu/fsync {c:8.1f} us  wall/fsync {w:8.1f} us  worst {x:8.0f} us")


if __name__ == "__main__":
    main()
