#!/usr/bin/env python3
"""Does overlapping a batch's write with the previous batch's fdatasync help a reply?

    scripts/fsync-overlap.py PATH [COUNT (default 3000)] [ROUNDS (default 3)]

Writes COUNT 4 KiB blocks with O_DIRECT into a preallocated, zero-filled file at PATH
(put it on the data directory's disk), two ways, interleaved ROUNDS times:
- in turn: write, fdatasync, write, fdatasync... (what a log stream's flusher does);
- overlapped: one thread writes block after block, a second fdatasyncs after each write
  (at most one write waiting), so a write runs while the previous block's fsync does.
Prints the time per block (the rate) and the median latency of a block from its write to
the end of the fsync that covers it (what a reply waits for). Figures in docs/results.md
(nineteenth session).
"""
import mmap
import os
import queue
import sys
import threading
import time

ALIGN = 4096


def fresh(path, count):
    if os.path.exists(path):
        os.remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    zeros = mmap.mmap(-1, ALIGN * (count + 1))
    os.pwrite(fd, zeros, 0)
    os.fdatasync(fd)
    return fd


def in_turn(path, count, buf):
    fd = fresh(path, count)
    lat = []
    t0 = time.perf_counter()
    for i in range(count):
        s = time.perf_counter()
        os.pwrite(fd, buf, i * ALIGN)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - s)
    el = time.perf_counter() - t0
    os.close(fd)
    return el / count, sorted(lat)[len(lat) // 2]


def overlapped(path, count, buf):
    fd = fresh(path, count)
    q = queue.Queue(maxsize=1)
    lat = []

    def syncer():
        while (s := q.get()) is not None:
            os.fdatasync(fd)
            lat.append(time.perf_counter() - s)

    th = threading.Thread(target=syncer)
    t0 = time.perf_counter()
    th.start()
    for i in range(count):
        s = time.perf_counter()
        os.pwrite(fd, buf, i * ALIGN)
        q.put(s)
    q.put(None)
    th.join()
    el = time.perf_counter() - t0
    os.close(fd)
    return el / count, sorted(lat)[len(lat) // 2]


def main():
    path = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    buf = mmap.mmap(-1, ALIGN)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(ALIGN))
    try:
        for _ in range(rounds):
            for name, f in (("in turn", in_turn), ("overlapped", overlapped)):
                per, p50 = f(path, count, buf)
                print(f"{name:10}  {per * 1e6:6.0f} us per block   p50 write-to-durable {p50 * 1e6:6.0f} us")
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
