"""Forward CPU time (one thread, time.thread_time: immune to being descheduled on a busy machine), blocks vs fp32."""
import os, sys, time, torch, json
torch.set_num_threads(1)
import specdec
from specdec.backends.forward import Target
from specdec.backends.specdec_engine.forward import SpecdecForward, _forced_kernels
from specdec.backends.specdec_engine.model_runner import Segment
from specdec.backends.slot_cache import StaticKVCache
isas = sys.argv[1].split(",")
sizes = [int(s) for s in sys.argv[2].split(",")]
reps = int(sys.argv[3])
model, tok = specdec.load_model()
fw = {}
for w in ("dense", "blocks"):
    os.environ["SPECDEC_GGUF_WEIGHTS"] = w
    fw[w] = SpecdecForward(Target.of(model))
g = torch.Generator().manual_seed(0)
ctx = 1024
out = {}
with torch.inference_mode():
    for isa in isas:
        caches = {}
        prompt = torch.randint(0, 49152, (1, ctx), generator=g)
        for w in fw:
            cache = StaticKVCache(fw[w].runner.num_layers, 2048, torch.device("cpu"))
            fw[w].runner.forward([Segment(prompt, torch.arange(ctx)[None], cache, 0, last_only=True)], _forced_kernels(isa, w == "blocks"))
            caches[w] = cache
        for n in sizes:
            toks = torch.randint(0, 49152, (1, n), generator=g)
            pos = torch.arange(ctx, ctx + n)[None]
            best = {w: 1e9 for w in fw}
            logits = {}
            for r in range(reps):
                for w in fw:
                    k = _forced_kernels(isa, w == "blocks")
                    t = time.thread_time()
                    (lg,) = fw[w].runner.forward([Segment(toks, pos, caches[w], ctx)], k)
                    best[w] = min(best[w], time.thread_time() - t)
                    logits[w] = lg
            same = torch.equal(logits["dense"], logits["blocks"])
            out[f"{isa}/{n}"] = {w: round(best[w] * 1e3, 2) for w in fw} | {"identical": same}
            print(isa, n, out[f"{isa}/{n}"], flush=True)
print(json.dumps(out))
