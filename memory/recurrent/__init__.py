"""Recurrent state (Mamba2's conv and SSM state), per sequence, with snapshots."""
