"""Materialised attention's torch.library pieces (registration.py); the math is in
kernelops.kernels.flash_attention.reference.attention_materialized."""
