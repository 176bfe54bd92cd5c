"""The prompt cache: finished slots' states kept in RAM, and a disk tier under it, reused
by later requests with the same prefix."""
