#!/bin/bash
# Give each task of a LUMI-G node its own GCD: task i sees only GCD i (as device 0), so PyTorch's
# cuda:0 is the right one and the CPU mask of srun matches it.
export ROCR_VISIBLE_DEVICES=$SLURM_LOCALID
exec "$@"
