cd /work/main && source .venv/bin/activate
O=/tmp/exp/fw/$1.jsonl; rm -f $O; N=$2
for rep in 1 2; do
  B=$(mktemp -d); mkdir -p $B/f $B/w $B/r
  for i in $(seq -1 $((N-1))); do python /tmp/exp/fw/trace4.py fresh $B/f "[$i]" $O 2>/dev/null; done
  python /tmp/exp/fw/trace4.py warmed $B/w "[$(seq -s, -1 $((N-1)))]" $O 2>/dev/null
  python /tmp/exp/fw/trace4.py reload $B/r "[$(seq -s, -1 $((N-1)))]" $O 2>/dev/null
  rm -rf $B
done
