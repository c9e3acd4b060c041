"""Parallelism: the device mesh, logical-axis rules and shardings; multi-process start-up."""
