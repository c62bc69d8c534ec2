import subprocess
import sys
from pathlib import Path

K = int(sys.argv[1])
R = int(sys.argv[2])
ps = [
    subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("proc.py"))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    for _ in range(K)
]
for p in ps:
    assert p.stdout.readline().strip() == "ready"
res = [[] for _ in range(K)]
for r in range(R):
    for k, p in enumerate(ps):
        p.stdin.write(f"{r}\n")
        p.stdin.flush()
        res[k].append(float(p.stdout.readline()))
for k in range(K):
    print(f"proc {k}: mean {sum(res[k]) / R:.2f}  rounds", " ".join(f"{x:.1f}" for x in res[k]))
for p in ps:
    p.stdin.close()
    p.wait()
