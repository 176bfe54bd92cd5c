"""``slotserve serve`` with a test hook patched in from the test side (production code
has no test flags). Run as ``python hooked_serve.py <control dir> serve ...``; the
test steers the hook through files in the control dir:

- ``load.gate``: model loading waits until this file exists (when ``load.wait`` exists
  at start-up), so a test sees the server while it loads, for as long as it likes.
- ``write.hold``: while it exists, a write into a temporary slot file writes half of
  its bytes and then blocks, so a test can kill the process in the middle of a save.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def _hook_loading(control: Path) -> None:
    from engine.core import engine as engine_module

    real_init = engine_module.Engine.__init__

    def gated_init(self, config, *args, **kwargs):
        if (control / "load.wait").exists():
            (control / "loading").touch()
            while not (control / "load.gate").exists():
                time.sleep(0.01)
        real_init(self, config, *args, **kwargs)

    engine_module.Engine.__init__ = gated_init


def _hook_disk(control: Path) -> None:
    from memory.files.slot_dir import TMP_PREFIX

    real_write = os.write

    def write(fd, data):
        hold = control / "write.hold"
        if hold.exists() and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(TMP_PREFIX):
            n = real_write(fd, bytes(data[: max(1, len(data) // 2)]))
            while hold.exists():
                time.sleep(0.01)
            return n
        return real_write(fd, data)

    os.write = write


def install(control: Path) -> None:
    """Both hooks, steered through files in ``control``."""
    _hook_loading(control)
    _hook_disk(control)


def main() -> int:
    control = Path(sys.argv[1])
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    install(control)
    from server.cli import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
