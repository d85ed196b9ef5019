"""Experiment runner, recipes, checkpointing and reporting for `credit`."""
