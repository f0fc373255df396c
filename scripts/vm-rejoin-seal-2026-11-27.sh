#!/bin/bash
# Alternates the build before an old primary's rejoin sealed its own log (BEFORE: a build
# of 06e9e77, which wrote a checkpoint at the cut before joining) and after it: 1.9M keys
# per node, SIGKILLs and switchovers (both restart the old primary, which rejoins through
# its own log cut at the point). Run from the repository root; the nodes' logs are kept,
# their data not.
set -u
out=/tmp/rejoinbench
for round in 1 2; do
  for build in before after; do
    for mode in kill switchover; do
      bin=target/release/ditto
      [ $build = before ] && bin=${BEFORE:-/tmp/before-target/release/ditto}
      d=$out/$build-$mode-$round
      rm -rf $d; mkdir -p $d
      extra=""; [ $mode = switchover ] && extra="--switchover"
      RUST_LOG=info timeout 900 $bin bench failover --preload 1900000 --kills 4 --between-s 1 $extra --dir $d/data --json > $d/out.json 2> $d/err.log
      echo "$build $mode $round rc=$?"
      pkill -f "server --node-id" ; sleep 1
      # keep the nodes' logs, not their data
      find $d/data -name '*.log' -size -50M -exec cp --parents {} $d/ \; 2>/dev/null
      rm -rf $d/data
    done
  done
done
