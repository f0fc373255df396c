#!/usr/bin/env python3
"""How fast this machine hands a process fresh memory: maps GB gigabytes of anonymous
memory, writes one byte per 4 KiB page, unmaps it, ROUNDS times, and prints GB/s for each
round. On a VM whose balloon device reports free pages to the host (virtio-balloon
free page reporting), memory the guest has not used lately is backed again by the host on
first touch: the first round there runs many times slower than the next ones, which reuse
the pages the first one just freed, and a run a few seconds later is slow again. Engine
runs that grow their heap pay this price per new page, so it is part of what TPC-C's
throughput measures on such a machine (docs/results.md, fourteenth session).

    scripts/first-touch.py [GB (default 2)] [ROUNDS (default 3)] [PAUSE_S between rounds (default 0)]
"""
import mmap
import sys
import time

gb = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
n = int(gb * (1 << 30)) // mmap.PAGESIZE * mmap.PAGESIZE
for r in range(rounds):
    if r and pause:
        time.sleep(pause)
    m = mmap.mmap(-1, n)
    t = time.perf_counter()
    for off in range(0, n, mmap.PAGESIZE):
        m[off] = 1
    d = time.perf_counter() - t
    m.close()
    print(f"round {r}: {gb:g} GB first-touched in {d:.3f} s = {gb / d:.2f} GB/s", flush=True)
