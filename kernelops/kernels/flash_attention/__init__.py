"""Flash attention implementations.

- Triton kernels: the pointer forward and backward (fwd.py, bwd.py), the TMA forward (fwd_tma.py),
  the split-KV decode (decode.py, decode_balanced.py), packed-sequence maps (varlen.py), dropout
  masks (dropout.py);
- Gluon (sm_90) kernels: the warp-specialised forward (fwd_ws.py, fwd_ws_fp8.py, fwd_tail.py) and
  backwards (bwd_ws.py, bwd_fused.py, bwd_d256.py), with their shared pieces in ws_common.py;
- choosing and launching: the op's default rules (choice.py), backward launch lists
  (backward.py), per-signature launch plans (plans.py), the entry points (dispatch.py), tile
  sizes (smem.py), run-time configs (runtime_config.py);
- the plain-torch platform and reference (reference.py) and the torch.library registration
  (registration.py).
"""
