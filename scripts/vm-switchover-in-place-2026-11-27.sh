#!/bin/bash
# The chain's bench (vm-seal-chain-2026-11-27.sh) for a switchover's old primary following
# in place: BEFORE a build of 168d817 (which restarted it as a backup from its directory),
# switchovers only. Run from the repository root.
OUT=${OUT:-/tmp/swbench} MODES=switchover exec "$(dirname "$0")/vm-seal-chain-2026-11-27.sh"
