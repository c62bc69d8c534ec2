cd /work/main && source .venv/bin/activate
S=/tmp/exp/fw/r1/sF; O=/tmp/exp/fw/$1.jsonl; rm -f $O
for rep in 1 2; do for i in 8 9 10 11 12 13 14 15; do
  python /tmp/exp/fw/trace2.py cold $S "[$i]" $O 2>/dev/null
  python /tmp/exp/fw/trace2.py warm $S "[$i]" $O 2>/dev/null
done; done
