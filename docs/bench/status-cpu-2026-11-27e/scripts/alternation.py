"""What alternate_fixed_trees.py and alternate_auto.py share: a long-lived child asked prompt by prompt, and fresh
children, each one JSON line (the child scripts print them)."""

import json
import subprocess
import sys
from pathlib import Path


def start_warmed(child, env=None):
    """The long-lived child (``CHILD warmed``), once it said it is ready."""
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name(child)), "warmed"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    json.loads(process.stdout.readline())
    return process


def ask(process, index):
    """The long-lived child's result for prompt ``index``."""
    process.stdin.write(f"{index}\n")
    process.stdin.flush()
    return json.loads(process.stdout.readline())


def fresh(child, index, env=None):
    """A fresh child's result for prompt ``index`` (``CHILD fresh INDEX``)."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(child)), "fresh", str(index)],
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])
