"""Task semantics: task sets and loaders, prompts and feedback, parsing, anti-hack rules, scores.

The pipeline sees only :mod:`rewards.interface`.
"""
