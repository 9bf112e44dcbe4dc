#!/bin/sh
# Stands in for a cluster launcher in tests of the launcher's command-template mode:
#   fake_launcher.sh srun N <cmd>      like `srun -n N <cmd>`: SLURM's task variables; the
#                                      ranks meet at the TCPStore mih hosts
#   fake_launcher.sh torchrun N <cmd>  like `torchrun --nproc-per-node=N <cmd>`: torchrun's
#                                      variables; rank 0 hosts the TCPStore itself, on the
#                                      port after mih's
# Starts N copies, waits for all, and fails if any failed.
mode=$1
n=$2
shift 2
if [ "$mode" = torchrun ]; then
  unset MIH_STORE_HOSTED
  MASTER_PORT=$((MASTER_PORT + 1))
  export MASTER_PORT
fi
pids=""
i=0
while [ "$i" -lt "$n" ]; do
  if [ "$mode" = torchrun ]; then
    RANK=$i WORLD_SIZE=$n LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 "$@" &
  else
    SLURM_PROCID=$i SLURM_NTASKS=$n SLURM_LOCALID=$i SLURM_NODEID=0 SLURM_TASKS_PER_NODE=$n "$@" &
  fi
  pids="$pids $!"
  i=$((i + 1))
done
rc=0
for p in $pids; do
  wait "$p" || rc=$?
done
exit "$rc"
