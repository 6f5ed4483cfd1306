"""Triton helpers shared by several attention ops."""
