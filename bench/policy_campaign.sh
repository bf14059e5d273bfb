#!/bin/bash
# The campaign of bench/results/policy_d4rl.md: bench/policy_campaign.sh WORKER (0 and 1, one process
# per core, started together). Every set of Hopper-v5, HalfCheetah-v5 and Walker2d-v5 (the data sets of
# python -m aaren_core.tasks.policy.generate), seeds outermost so that a cut campaign has whole
# seeds; each run's target return is its data set's best episode return (bench/results/policy_datasets.md).
# Then: python -m bench.policy_compare --report --out runs/policy-campaign --envs Hopper-v5,HalfCheetah-v5,Walker2d-v5 \
#   --kinds medium,medium-replay,medium-expert --models aaren,transformer,gru,bc --seeds 0,1,2 --time-budget 60
set -e
W=$1
OUT=${OUT:-runs/policy-campaign}
PY=${PY:-.venv/bin/python}
declare -A TARGET=( [Hopper-v5:medium]=667 [Hopper-v5:medium-replay]=532 [Hopper-v5:medium-expert]=3336 [HalfCheetah-v5:medium]=558 [HalfCheetah-v5:medium-replay]=480 [HalfCheetah-v5:medium-expert]=1545 [Walker2d-v5:medium]=610 [Walker2d-v5:medium-replay]=706 [Walker2d-v5:medium-expert]=2351 )
for seed in 0 1 2; do
  for env in ${ENVS:-Hopper-v5 HalfCheetah-v5 Walker2d-v5}; do
    for kind in medium medium-replay medium-expert; do
      $PY -m bench.policy_compare --envs $env --kinds $kind --models aaren,transformer,gru,bc --seeds $seed \
        --time-budget 60 --episodes 10 --set target_return=${TARGET[$env:$kind]} --worker $W/2 --out $OUT
    done
  done
done
echo CAMPAIGN-DONE
