import json
import statistics as st
import subprocess
import sys

py = sys.executable
L = subprocess.Popen(
    [py, "/tmp/exp/fw/fl.py", "long"],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
)
assert L.stdout.readline().startswith("ready")
F, W = [], []
for r in range(10):
    idx = r % 8
    f = json.loads(
        subprocess.run([py, "/tmp/exp/fw/fl.py", "fresh", str(idx)], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    L.stdin.write(f"{idx}\n")
    L.stdin.flush()
    w = json.loads(L.stdout.readline())
    F.append(f)
    W.append(w)
    print(f"round {r}: fresh {f:.2f} long {w:.2f} ms/step", flush=True)
print(f"mean fresh {st.mean(F):.2f} long {st.mean(W):.2f} ratio {st.mean(F) / st.mean(W):.3f}")
L.stdin.close()
L.wait()
