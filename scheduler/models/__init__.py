"""What is trained: model presets and their analytic sizes, Hugging Face configs, activations.

Imports only scheduler.errors and scheduler.units.
"""
