#!/bin/bash
# The two data-parallel training checks (suite multi): beautiful_mnist on two logical CPU devices (DEVICES=CPU:0,CPU:1)
# and on two MPI ranks (mpirun -np 2, half the batch each) against one device with the whole batch, 3 steps.
#   in-process: the same losses within float tolerance (sums in another order; Adam amplifies that a little)
#   MPI:        every step the ranks' weights are bit-identical (--check-replicas), and the losses are within 4%
#               of one process's: each rank's batchnorm normalises with its own half batch's statistics (as
#               PyTorch's DistributedDataParallel without SyncBatchNorm), the rest is the same computation.
# usage: multi_mnist.sh BEAUTIFUL_MNIST HAVE_MPI(0|1)
set -euo pipefail
exe=$1
have_mpi=$2
export STEPS=3 THREADS=1 BS=128 EVAL=0
losses() { grep -o 'loss *[0-9.]*' | awk '{print $2}' | tr '\n' ' '; }
compare() {  # name, want, got, relative tolerance
  echo "$1: one device [$2] vs [$3]"
  awk -v a="$2" -v b="$3" -v tol="$4" -v name="$1" 'BEGIN {
    n = split(a, x, " "); m = split(b, y, " ");
    if (n != m || n == 0) { print name ": " n " vs " m " losses"; exit 1 }
    for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > tol * x[i]) { print name ": step " i " loss " y[i] " vs " x[i]; exit 1 } }
  }'
}
one=$("$exe" | losses)
two=$(DEVICES=CPU:0,CPU:1 "$exe" | losses)
compare "DEVICES=CPU:0,CPU:1" "$one" "$two" 0.005
if [ "$have_mpi" = 1 ] && command -v mpirun > /dev/null; then
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BS=64 \
        mpirun -np 2 --oversubscribe "$exe" --check-replicas)
  echo "$out" | grep -q "bit-identical after every step" || { echo "$out"; echo "no replica check line"; exit 1; }
  compare "mpirun -np 2" "$one" "$(echo "$out" | losses)" 0.04
else
  echo "MPI: not built with MPI or no mpirun; skipped"
fi
