"""Trusted stamps: a large datastore verified once loads without re-reading every byte.

A verified load (:func:`~specdec.datastores.format.read_datastore` with ``verify=True``)
checks every section's CRC-32: a full read of the file, ~0.35 s per 10M tokens of a static
automaton, paid by every process that opens it. After the first full verification of a
file of at least :data:`TRUST_MIN_BYTES`, a **stamp** is written under
``<cache_dir>/trusted/`` recording what identifies that exact file state:

- its resolved path, device and inode, size, modification time and change time (ns);
- the SHA-256 of its header, which holds every section's CRC-32 (so the stamp is tied to
  the checksums the sections were verified against).

A later verified load whose file matches the stamp in every field skips the CRC pass; the
header's own checks (magic, version, header CRC, tokenizer, truncation) always run. Any
write to the file changes its modification and change times (the change time cannot be
set back by a user, unlike the modification time), a replaced file has another inode, a
copy another path: each then gets a full verification, which refuses a corrupt or
truncated file as before, and a new stamp when it passes. What a stamp cannot see is
corruption that changes neither (a failing disk); for that certainty, set
``SPECDEC_TRUST_STAMPS=0`` (every verified load reads the whole file, as before stamps; also
what a benchmark of the full verification wants) or delete the stamps (``specdec cache
clear trusted``). Drafts from a datastore are
still verified by the model, so such a file costs speed, never correctness.

File timestamps are coarse (a clock tick of a few ms; 2 s on some file systems), so two
writes close together can leave the same times. As git does for its index ("racy clean"),
a file whose modification or change time is less than :data:`RACY_S` old is not stamped:
any write after a stamp then shows as a new time. A freshly built datastore is therefore
stamped at its first verified load a few seconds after the build, not during it.

A stamp that does not parse or fails its own checksum is ignored with a one-line warning
(the file is then verified in full and stamped again); a stamp that no longer matches its
file is the normal case of a rewritten datastore and is replaced silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

from specdec.cachefiles import checksum, folder, write_atomically

TRUST_MIN_BYTES = 32 << 20  # smaller files verify in a few tens of ms: not worth a stamp
RACY_S = 2.0  # a file changed more recently than this is not stamped (coarse file timestamps; module docstring)
STAMP_FORMAT = "specdec.trusted-datastore"
STAMP_VERSION = 1
SWITCH_ENV = "SPECDEC_TRUST_STAMPS"  # "0", "false", "off", "no": never load on a stamp


_OFF = frozenset({"0", "false", "off", "no"})


def stamp_path(source: Path) -> Path:
    """Where the stamp of the datastore at ``source`` (a resolved path) lives."""
    return folder("trusted") / f"{hashlib.sha256(str(source).encode()).hexdigest()[:16]}.json"


def _file_state(source: Path, status: os.stat_result, header: dict[str, Any]) -> dict[str, Any]:
    """What identifies this exact state of the file (module docstring)."""
    return {
        "path": str(source),
        "device": status.st_dev,
        "inode": status.st_ino,
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
        "ctime_ns": status.st_ctime_ns,
        "header_sha256": hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest(),
    }


def is_trusted(source: Path, status: os.stat_result, header: dict[str, Any]) -> bool:
    """Whether ``source`` (in state ``status``, with ``header``) was verified in full before, unchanged since."""
    if status.st_size < TRUST_MIN_BYTES or os.environ.get(SWITCH_ENV, "1").strip().lower() in _OFF:
        return False
    path = stamp_path(source)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as error:
        warnings.warn(f"specdec: ignoring the unreadable datastore stamp {path} ({error}); verifying {source} in full",
                      RuntimeWarning, stacklevel=3)
        return False
    state = document.get("state") if isinstance(document, dict) else None
    if (
        not isinstance(state, dict)
        or document.get("format") != STAMP_FORMAT
        or document.get("version") != STAMP_VERSION
        or document.get("checksum") != checksum(state)
    ):
        warnings.warn(f"specdec: ignoring the corrupt or foreign datastore stamp {path}; verifying {source} in full",
                      RuntimeWarning, stacklevel=3)
        return False
    return bool(state == _file_state(source, status, header))


def remember_verified(source: Path, status: os.stat_result, header: dict[str, Any]) -> None:
    """Stamp ``source`` after a full verification that began when its state was ``status``.

    Nothing is stamped when the file changed during the verification or less than
    :data:`RACY_S` before it, or is small; a stamp that cannot be written is skipped (it only
    saves time).
    """
    if status.st_size < TRUST_MIN_BYTES or time.time() - max(status.st_mtime_ns, status.st_ctime_ns) / 1e9 < RACY_S:
        return
    try:
        now = source.stat()
    except OSError:
        return
    if (now.st_size, now.st_mtime_ns, now.st_ctime_ns, now.st_ino) != (
        status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino
    ):
        return
    state = _file_state(source, status, header)
    document = {"format": STAMP_FORMAT, "version": STAMP_VERSION, "checksum": checksum(state), "state": state}
    with contextlib.suppress(OSError):  # a stamp only saves time
        write_atomically(stamp_path(source), json.dumps(document, indent=1))
