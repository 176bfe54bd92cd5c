"""``slotserve serve`` with a test hook patched in from the test side (production code
has no test flags). Run as ``python hooked_serve.py <control dir> serve ...``; the
test steers the hook through files in the control dir:

- ``load.gate``: model loading waits until this file exists (when ``load.wait`` exists
  at start-up), so a test sees the server while it loads, for as long as it likes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


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


def main() -> int:
    control = Path(sys.argv[1])
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    _hook_loading(control)
    from server.cli import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
