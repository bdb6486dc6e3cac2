"""Task semantics: task sets and loaders, prompts and feedback, parsing, anti-hack rules, scores.

The pipeline's training and evaluation see only :mod:`rewards.interface`; its supervised warm
start also reads the answer corpus, prompts and rules.
"""
