#!/bin/sh
# Stands in for SLURM's srun (not a Debian package this machine can run) in tests of the
# launcher's command-template mode:
#   fake_launcher.sh srun N <cmd>   like `srun -n N <cmd>` inside a one-node allocation: every
#                                   task gets exactly the variables srun sets for it (job,
#                                   step, node and task variables; never MASTER_ADDR/PORT,
#                                   RANK or SLURM_NTASKS_PER_NODE, which srun sets only with
#                                   --ntasks-per-node); the ranks meet at the TCPStore mih hosts
# torchrun and mpirun are tested for real (tests/cli/launchers.py).
# Starts N copies, waits for all, and fails if any failed.
mode=$1
n=$2
shift 2
if [ "$mode" != srun ]; then
  echo "fake_launcher.sh: unknown mode '$mode' (only srun; torchrun and mpirun are run for real)" >&2
  exit 2
fi
host=$(hostname)
gtids=""
i=0
while [ "$i" -lt "$n" ]; do
  gtids="$gtids${gtids:+,}$i"
  i=$((i + 1))
done
export SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_JOB_NAME=mih-test SLURM_JOB_NUM_NODES=1 SLURM_NNODES=1 \
  SLURM_JOB_NODELIST="$host" SLURM_NODELIST="$host" SLURM_JOB_CPUS_PER_NODE="$n" SLURM_CLUSTER_NAME=mih \
  SLURM_SUBMIT_DIR="$PWD" SLURM_SUBMIT_HOST="$host" SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_STEP_NUM_NODES=1 \
  SLURM_STEP_NUM_TASKS="$n" SLURM_STEP_NODELIST="$host" SLURM_STEP_TASKS_PER_NODE="$n" SLURM_NTASKS="$n" \
  SLURM_NPROCS="$n" SLURM_TASKS_PER_NODE="$n" SLURM_CPUS_ON_NODE="$n" SLURM_DISTRIBUTION=block \
  SLURM_GTIDS="$gtids" SLURM_NODEID=0 SLURMD_NODENAME="$host" SLURM_TOPOLOGY_ADDR="$host" \
  SLURM_TOPOLOGY_ADDR_PATTERN=node SLURM_LAUNCH_NODE_IPADDR=127.0.0.1 SLURM_SRUN_COMM_HOST=127.0.0.1 \
  SLURM_PRIO_PROCESS=0 SLURM_UMASK=0022
pids=""
i=0
while [ "$i" -lt "$n" ]; do
  # SLURM_TASK_PID is the task's own pid: the shell that execs the command keeps it.
  SLURM_PROCID=$i SLURM_LOCALID=$i sh -c 'export SLURM_TASK_PID=$$; exec "$@"' sh "$@" &
  pids="$pids $!"
  i=$((i + 1))
done
rc=0
for p in $pids; do
  wait "$p" || rc=$?
done
exit "$rc"
