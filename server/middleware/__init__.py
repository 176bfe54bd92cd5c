"""Plain ASGI middleware around every route: path prefix, CORS, API key, body limit,
header case."""
