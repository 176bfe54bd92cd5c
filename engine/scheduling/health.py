"""What the engine thread reports of itself (/health, /metrics): liveness, queue
and running counts, faults, and the clock of its steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Health:
    alive: bool
    stalled: bool
    n_waiting: int
    n_running: int
    n_faults: int  # engine steps that raised, since start
    n_faults_in_row: int  # ... since the last step that succeeded
    steps: StepClock | None = None


@dataclass
class StepClock:
    """Engine steps since start: their count, wall time, and the engine thread's CPU
    time inside them. ``1 - cpu_s / wall_s`` is the share of step time the engine
    thread was off the CPU: waiting for the GIL, or preempted by other threads."""

    n: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    n_decode: int = 0  # of those, steps of one token per sequence (no prefill)
    decode_wall_s: float = 0.0
    n_busy: int = 0  # sequences running, summed over the completed steps (llama-server's busy slots per decode)

    def add(self, wall: float, cpu: float, n_busy: int, decode_only: bool) -> None:
        """One completed step: its wall and CPU seconds, the sequences it ran, and
        whether it was one token per sequence."""
        self.n, self.wall_s, self.cpu_s, self.n_busy = (
            self.n + 1,
            self.wall_s + wall,
            self.cpu_s + cpu,
            self.n_busy + n_busy,
        )
        if decode_only:
            self.n_decode, self.decode_wall_s = self.n_decode + 1, self.decode_wall_s + wall
