"""Tuning control: how kernelops picks a launch config for a call, and how to steer it.

- ``executor.explain(...)``: which selector answered, the key, the config, and why every earlier
  selector declined;
- an explicit ``cfg=``: used as given (fields left None come from the heuristic), never cached;
- ``config_overlay({op: cfg})``: every call of that op inside the block uses ``cfg``;
- ``AutotunePolicy`` (``auto`` | ``never`` | ``always``), also from ``KERNELOPS_AUTOTUNE``;
- a private ``Executor`` with its own ``ConfigCache`` folder (here a temporary one), installed as
  the default for the module-level functions.

A config changes speed, never results: every variant below is checked against a float64
reference. Runs on a GPU (Triton kernels) or a CPU (the torch platform, where the selector chain
still answers but tile parameters do not apply), small sizes, and never touches the user's cache:

    python examples/tuning_control.py
"""

import os
import tempfile

import torch

import kernelops
from kernelops import FlashAttentionConfig, FwdParams, flash_attention
from kernelops.kernels.flash_attention.reference import attention_materialized
from kernelops.modules.attention_args import UNBOUNDED
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import (
    AutotunePolicy, ConfigCache, ConfigSelectorChain, Executor, config_overlay, device_info, set_default_executor,
)
from kernelops.ops.cache import make_entry
from kernelops.tuning.sinks import DiskCacheSink


def max_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double() - ref).abs().max().item()


def main() -> dict:
    """Prints each step; returns the selector that answered each step (``selectors``), the results'
    errors against float64 (``errors``) and the ``tolerance`` they were held to."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(2, 192, 8, 64, device=device, dtype=dtype)  # [B, Sq, Hq, D]
    k = torch.randn(2, 192, 2, 64, device=device, dtype=dtype)  # [B, Sk, Hkv, D]: GQA 4
    v = torch.randn_like(k)
    call = dict(query=q, key=k, value=v, causal=True)
    ref, _ = attention_materialized(q.double(), k.double(), v.double(), softmax_scale=64 ** -0.5,
                                    win_left=UNBOUNDED, win_right=0, softcap=None)
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-4
    selectors, errors = {}, {}

    with tempfile.TemporaryDirectory(prefix="kernelops-example-") as folder:
        # A private executor: its own cache folder, autotuning off. Installed as the default, so the
        # module-level flash_attention uses it too (and the user's cache folder is never opened).
        cache = ConfigCache(os.path.join(folder, "cache"))
        executor = Executor(ConfigSelectorChain(cache=cache, policy="never"))
        previous = set_default_executor(executor)
        try:
            print(f"kernelops {kernelops.__version__} on {device}; private cache at {cache.directory}")

            # 1. explain: the chain asks explicit, overlay, memory, disk, pretuned, autotune, heuristic
            how = executor.explain(FLASH_ATTENTION, **call)
            selectors["plain"] = how.selector
            print(f"\n1. plain call -> '{how.selector}' on platform '{how.platform}'")
            for name, reason in how.declined:
                print(f"     {name:9s} declined: {reason}")
            print(f"   config: {how.config}")

            # 2. an explicit cfg= wins, is completed from the heuristic, and is never cached
            cfg = FlashAttentionConfig(fwd_params=FwdParams(q_blocksize=32, kv_blocksize=32, num_warps=4,
                                                            num_stages=1))
            out = flash_attention(q, k, v, causal=True, cfg=cfg)
            how = executor.explain(FLASH_ATTENTION, cfg=cfg, **call)
            print(f"\n2. cfg= -> '{how.selector}': fwd {how.config.fwd_params}, bwd from the heuristic "
                  f"{how.config.bwd_params}")
            print(f"   max error vs float64: {max_error(out, ref):.2e}; disk entries written: {cache.disk_count()}")
            selectors["cfg"], errors["cfg"] = how.selector, max_error(out, ref)
            assert how.selector == "explicit" and max_error(out, ref) < tolerance and cache.disk_count() == 0

            # 3. config_overlay: every flash_attention call inside the block uses this config
            overlay = FlashAttentionConfig(fwd_params=FwdParams(64, 32, 4, 2))
            with config_overlay({"flash_attention": overlay}):
                how = executor.explain(FLASH_ATTENTION, **call)
                out = flash_attention(q, k, v, causal=True)
            print(f"\n3. config_overlay -> '{how.selector}': fwd {how.config.fwd_params}; "
                  f"max error {max_error(out, ref):.2e}")
            assert how.selector == "overlay" and max_error(out, ref) < tolerance
            selectors["overlay"], errors["overlay"] = how.selector, max_error(out, ref)
            selectors["after overlay"] = executor.explain(FLASH_ATTENTION, **call).selector
            print(f"   after the block -> '{selectors['after overlay']}'")

            # 4. policies: auto (tune on a miss when safe), never, always (ignore persisted entries, re-tune)
            print(f"\n4. KERNELOPS_AUTOTUNE here: {os.environ.get('KERNELOPS_AUTOTUNE', '(unset)')} -> "
                  f"{AutotunePolicy.from_env().value}; this executor's policy: {executor.chain.policy.value}")
            for policy in ("never", "always"):
                if policy == "always" and device == "cuda":
                    print("   policy=always would tune this key now on the GPU (skipped in this example)")
                    continue
                executor.chain.policy = policy
                how = executor.explain(FLASH_ATTENTION, **call)
                selectors[f"policy={policy}"] = how.selector
                print(f"   policy={policy}: '{how.selector}'; autotune: {dict(how.declined).get('autotune')}")
            executor.chain.policy = "never"

            # 5. the private disk cache: an entry stored under the key the chain reads (as
            # `kernelops tune` writes it after timing) now answers this call
            inputs = FLASH_ATTENTION.prepare(**call)
            tuned = FLASH_ATTENTION.with_params(FLASH_ATTENTION.heuristic_config(inputs, device_info(device)), "fwd",
                                                FwdParams(32, 64, 4, 2))
            sink = DiskCacheSink(cache, FLASH_ATTENTION, device_info(q.device))
            sink.put(FLASH_ATTENTION.key(inputs), inputs, make_entry(tuned, source="example"))
            fresh = Executor(ConfigSelectorChain(cache=ConfigCache(cache.directory), policy="never"))
            how = fresh.explain(FLASH_ATTENTION, **call)
            print(f"\n5. after storing an entry in {cache.directory}: a fresh executor -> '{how.selector}', "
                  f"fwd {how.config.fwd_params}")
            assert how.selector == "disk" and how.config.fwd_params == tuned.fwd_params
            out = fresh(FLASH_ATTENTION, **call)
            print(f"   max error vs float64: {max_error(out, ref):.2e}")
            assert max_error(out, ref) < tolerance
            selectors["stored entry"], errors["stored entry"] = how.selector, max_error(out, ref)
        finally:
            set_default_executor(previous)
            cache.close()
    return {"selectors": selectors, "errors": errors, "tolerance": tolerance}


if __name__ == "__main__":
    main()
