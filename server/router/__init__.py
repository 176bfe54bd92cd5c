"""Router mode (``--models-dir``): many models behind one address, each in a child
server process of its own, started on its first request and stopped when idle past
``--models-max``; requests are proxied to the child by their ``model``."""
