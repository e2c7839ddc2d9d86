"""Tasks: pre- and post-processing that turn several named sub-models into one model (task.py is the interface)."""
