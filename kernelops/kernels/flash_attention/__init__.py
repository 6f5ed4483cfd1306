"""Flash attention implementations: Triton kernels (fwd.py, bwd.py), the plain-torch platform and
reference (reference.py), and the torch.library registration (registration.py)."""
