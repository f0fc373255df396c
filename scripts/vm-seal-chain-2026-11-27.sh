#!/bin/bash
# Alternates the build before a change (BEFORE, default /tmp/before-target/release/ditto:
# for the chain of seals, a build of 93e40ff) and after it (target/release/ditto): 1.9M
# keys per node, 1 s of load after each rejoin before the next failover (so they come 3-5
# s apart, most within the 3-4 s of the last seal's paced checkpoint), two rounds of MODES
# (default: SIGKILLs and switchovers). Run from the repository root; OUT (default
# /tmp/chainbench) keeps each run's output and the nodes' logs, not their data.
set -u
out=${OUT:-/tmp/chainbench}
modes=${MODES:-kill switchover}
for round in 1 2; do
  for build in before after; do
    for mode in $modes; do
      bin=target/release/ditto
      [ $build = before ] && bin=${BEFORE:-/tmp/before-target/release/ditto}
      d=$out/$build-$mode-$round
      rm -rf $d; mkdir -p $d
      extra=""; [ $mode = switchover ] && extra="--switchover"
      RUST_LOG=info timeout 900 $bin bench failover --preload 1900000 --kills 4 --between-s 1 $extra --dir $d/data --json > $d/out.json 2> $d/err.log
      echo "$build $mode $round rc=$?"
      pkill -f "server --node-id" ; sleep 1
      find $d/data -name '*.log' -size -50M -exec cp --parents {} $d/ \; 2>/dev/null
      rm -rf $d/data
    done
  done
done
