"""The transformers hetsched trains: GPT, Llama, their families, weight init, Hugging Face.

May import torch and scheduler/; no other workers package, never Ray.
"""
