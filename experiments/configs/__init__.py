"""Recipe configs: one file per method/task, each with `get_config(arg)`."""
