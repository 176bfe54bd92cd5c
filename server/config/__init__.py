"""The server's settings: one declaration per setting (the field, its flags, its environment name,
its help), the command line parsed into them, sampling and LoRA defaults."""
