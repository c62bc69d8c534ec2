cd /work/main && source .venv/bin/activate
F=specdec/backends/csrc/skinny_linear.cpp
for r in 1 2; do
  git show 5f2c679:$F > $F
  python -c "from specdec.backends import cpu_kernels; cpu_kernels.load()"
  specdec bench curves --variants "before=auto:cache=native:kernels=cpu" --sizes 1,2,4,8,16,32,64 --contexts 1024 --repeats 3 --out /tmp/exp/cab_old_$r 2>&1 | grep -E "^\| 1024|Reading"
  git checkout -q $F
  python -c "from specdec.backends import cpu_kernels; cpu_kernels.load()"
  specdec bench curves --variants "after=auto:cache=native:kernels=cpu" --sizes 1,2,4,8,16,32,64 --contexts 1024 --repeats 3 --out /tmp/exp/cab_new_$r 2>&1 | grep -E "^\| 1024|Reading"
done
git status --short
