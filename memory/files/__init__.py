"""Slot files: the on-disk format of a saved sequence and the folder that holds them."""
