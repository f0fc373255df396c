#!/bin/bash
# Alternates the build before a switchover's old primary followed in place (BEFORE: a build
# of 168d817, which restarted it as a backup from its directory) and after it: 1.9M keys
# per node, 4 switchovers per run, 1 s of load after each rejoin, two rounds. Run from the
# repository root; the nodes' logs are kept, their data not.
set -u
out=${OUT:-/tmp/swbench}
for round in 1 2; do
  for build in before after; do
    bin=target/release/ditto
    [ $build = before ] && bin=${BEFORE:-/tmp/before-target/release/ditto}
    d=$out/$build-switchover-$round
    rm -rf $d; mkdir -p $d
    RUST_LOG=info timeout 900 $bin bench failover --preload 1900000 --kills 4 --between-s 1 --switchover --dir $d/data --json > $d/out.json 2> $d/err.log
    echo "$build switchover $round rc=$?"
    pkill -f "server --node-id" ; sleep 1
    find $d/data -name '*.log' -size -50M -exec cp --parents {} $d/ \; 2>/dev/null
    rm -rf $d/data
  done
done
