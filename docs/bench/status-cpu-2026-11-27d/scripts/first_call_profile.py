import cProfile
import io
import pstats

import specdec
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

model, tok = load_model(None)
ids = encode_prompt(tok, heldout_prompts()[3].text, None)
for i in range(2):
    pr = cProfile.Profile()
    pr.enable()
    r = specdec.run(model, ids, "sam+recycling", tokenizer=tok, max_new_tokens=16)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
    print("=== call", i)
    print(s.getvalue()[:9000])
