"""Where a new request's prompt start comes from: the slot's own cache, a longer prefix
another slot holds (copied), blocks the pool kept by their tokens' hash, or the prompt
cache (RAM, disk). A mixin of ``TaskBoard``, which owns the state it reads."""

from __future__ import annotations

from engine.scheduling.request import Request
from engine.scheduling.slots import Slot, common_prefix
from memory import CacheFull


class PrefixReuse:
    """What ``TaskBoard`` provides: ``engine``, ``table``, ``prompt_cache``,
    ``n_pool_tokens`` and ``cached_tokens(slot)``."""

    def _reuse_prefix(self, slot: Slot, req: Request, key: tuple[float, ...] = ()) -> int:
        """Tokens of the prompt the slot holds after keeping its own prefix or copying a
        longer one from another slot (busy or idle) computed with the same LoRA scales
        (``key``); the pool and the prompt cache hold base-model caches only."""
        prompt, memory = req.keys, self.engine.memory
        slot.restored = None
        own = memory.seq_cut_point(slot.id, common_prefix(slot.cached, prompt)) if slot.lora == key else 0
        best, n_best = None, own
        for other in self.table.slots:
            if other is slot or other.lora != key:
                continue
            n = memory.seq_cut_point(other.id, common_prefix(self.cached_tokens(other), prompt))
            if n > n_best:
                best, n_best = other, n
        if not key and memory.cached_prefix(prompt) > n_best:  # blocks kept in the pool by their tokens' hash
            own = n_best = memory.attach_prefix(slot.id, prompt)
            best, slot.cached = None, prompt[:n_best]
            self.n_pool_tokens += n_best
        cache = self.prompt_cache if not key else None
        restored = cache.restore_into(memory, slot, prompt, n_best) if cache else None
        if restored is not None:
            return restored
        if best is None:
            return own
        try:
            self.engine.memory.seq_cp(best.id, slot.id, 0, n_best)
        except CacheFull:
            return 0  # seq_cp replaced nothing; the slot may still hold its own prefix, but be safe
        slot.cached = prompt[:n_best]
        return n_best
