"""Faithful small copies of published checkpoints' tokenizer and config files (README.md)."""
