"""tfds dataset `credit_tasks`: the built-in tasks as array_record files."""
