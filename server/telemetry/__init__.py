"""What the server tells watchers: Prometheus metrics (its own and llama-server's names)
and progress of long tasks."""
