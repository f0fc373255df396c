#!/bin/bash
# The chain's bench (vm-seal-chain-2026-11-27.sh) for an old primary's rejoin sealing its
# own log: BEFORE a build of 06e9e77 (which wrote a checkpoint at the cut before joining),
# SIGKILLs and switchovers (both restart the old primary, which rejoins through its own
# log cut at the point). Run from the repository root.
OUT=${OUT:-/tmp/rejoinbench} exec "$(dirname "$0")/vm-seal-chain-2026-11-27.sh"
