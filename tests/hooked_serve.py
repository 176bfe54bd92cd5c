"""``slotserve serve`` with test hooks patched in from the test side (production code
has no fault flags). Run as ``python hooked_serve.py <control dir> serve ...``; the
test steers the hooks through files in the control dir:

- ``load.gate``: model loading waits until this file exists (when ``load.wait`` exists
  at start-up), so a test sees the server while it loads, for as long as it likes.
- a prompt that starts with ``FAULT_PROMPT`` makes every engine step that includes it
  raise, as a device fault or a bug in the forward would.
- ``enospc``: while it exists, writes into slot files fail with ENOSPC (a full disk)
  after the first 4 KiB, so a temporary file exists when the error comes.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

FAULT_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def _hook_loading(control: Path) -> None:
    from engine import engine as engine_module

    real_init = engine_module.Engine.__init__

    def gated_init(self, config):
        if (control / "load.wait").exists():
            (control / "loading").touch()
            while not (control / "load.gate").exists():
                time.sleep(0.01)
        real_init(self, config)

    engine_module.Engine.__init__ = gated_init


def _hook_forward() -> None:
    from engine.runner import ModelRunner

    real_run = ModelRunner.run

    def faulty_run(self, plan):
        if any(c.seq.prompt_ids[: len(FAULT_PROMPT)] == FAULT_PROMPT for c in plan):
            raise RuntimeError("injected fault in the forward")
        return real_run(self, plan)

    ModelRunner.run = faulty_run


def _hook_disk(control: Path) -> None:
    real_write = os.write

    def write(fd, data):
        if (control / "enospc").exists() and os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1].startswith("."):
            if os.lseek(fd, 0, os.SEEK_CUR) >= 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, bytes(data[:4096]))
        return real_write(fd, data)

    os.write = write


def main() -> int:
    control = Path(sys.argv[1])
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    _hook_loading(control)
    _hook_forward()
    _hook_disk(control)
    from server.cli import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
