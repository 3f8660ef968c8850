"""memplan: simulate and plan GPU memory schedules for deep-learning training."""

__version__ = "0.1.0"
