"""Ring / context-parallel attention over torch.distributed (planned; see the issues)."""
