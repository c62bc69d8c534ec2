#!/usr/bin/env bash
# A/B of the tail change: old (22eeed7) and new (HEAD) alternating, same learned-state handling as the bench.
source /work/main/.venv/bin/activate
for round in 1 2; do
  for arm in old new; do
    if [ $arm = old ]; then dir=WORKTREE_OLD; else dir=/work/main; fi
    out=OUT/$arm$round; mkdir -p $out
    (cd $dir && SPECDEC_RECYCLING_DIR=$(mktemp -d) SPECDEC_PLANNER_DIR=$(mktemp -d) PYTHONPATH=$dir \
      python -c "import sys; from specdec.commands import main; sys.exit(main())" bench batch --batch-size 4,8 \
      --drafters none,sam+recycling --prompts 16 --max-new-tokens 128 --repeats 2 --out $out --quiet --no-plot) > $out/log.txt 2>&1
    echo "$arm$round done $(date -u +%T)"
  done
done
