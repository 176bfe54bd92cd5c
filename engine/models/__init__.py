"""Model definitions: one file per architecture, built from the shared layers
(``layers``, ``rope``, ``ssm``, ``moe``); ``registry`` maps architecture names to
classes and ``config`` reads config.json (transformers 4 and 5)."""
