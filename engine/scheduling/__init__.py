"""Requests on slots: the scheduler's engine thread, the task board (admission, prefix
reuse, fan-out of n choices, events back), the slot table, slot snapshots and restores,
and the request and event types that cross to the HTTP side. Owns no tensors."""
