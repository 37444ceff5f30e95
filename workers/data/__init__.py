"""Training data: dataset files on disk, language-modelling samples in a split-free order.

May import torch and scheduler/; no other workers package.
"""
