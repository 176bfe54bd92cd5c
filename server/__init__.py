"""HTTP side of slotserve (the server lands with the next issue); the console script."""
