#!/bin/sh
# Stands in for `torchrun --nproc-per-node=N <cmd>` in launcher tests: starts N copies with
# torchrun's variables; rank 0 hosts the TCPStore (mih's launcher does not), on the port
# after the launcher's own.
n=$1
shift
unset MIH_STORE_HOSTED
port=$((MASTER_PORT + 1))
pids=""
i=0
while [ "$i" -lt "$n" ]; do
  RANK=$i WORLD_SIZE=$n LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" &
  pids="$pids $!"
  i=$((i + 1))
done
rc=0
for p in $pids; do
  wait "$p" || rc=$?
done
exit "$rc"
