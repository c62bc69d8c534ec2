#!/bin/sh
# Peak RSS of loading a random 1B-shape llama GGUF (specdec.bench.random_gguf), dense against blocks-only, each in a
# fresh process under /usr/bin/time -v, then one greedy 32-token generation on engine="specdec" (the tokens' hash
# must match between the two loads). Files under /tmp, never in git.
set -e
for t in Q8_0 Q4_K; do
  [ -f /tmp/llama-1b.$t.gguf ] || python -m specdec.bench.random_gguf write /tmp/llama-1b.$t.gguf --type $t
  for w in blocks dense; do
    /usr/bin/time -v python -m specdec.bench.random_gguf measure /tmp/llama-1b.$t.gguf --weights $w 2>/tmp/time.err
    grep "Maximum resident" /tmp/time.err
  done
done
