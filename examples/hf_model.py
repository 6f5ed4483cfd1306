"""A Hugging Face transformers model on kernelops attention.

Builds a tiny Llama (random weights, no download) with ``attn_implementation="kernelops"``,
compares its logits on a left-padded batch with the same weights under ``"sdpa"``, and decodes
greedily with both: the logits agree to rounding and the greedy tokens are the same. Needs
``pip install transformers``; runs on a GPU (Triton kernels, bf16) or a CPU (the torch platform,
float32) in seconds:

    python examples/hf_model.py
"""

import copy

import torch
import transformers

from kernelops.integrations.transformers import register


def main() -> dict:
    """Prints the comparison; returns ``max_logit_diff`` (over real tokens), the generated ``tokens``
    of each implementation (``[3, 24 + 8]``) and whether they are ``same``."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    name = register()  # "kernelops": an attn_implementation from now on

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                                      pad_token_id=0, initializer_range=0.2)
    models, weights = {}, None
    for impl in (name, "sdpa"):  # same weights, two attention implementations
        # from_config records the implementation in the config it is given: one copy per model
        model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)
        weights = weights or model.state_dict()
        model.load_state_dict(weights)
        models[impl] = model.to(device=device, dtype=dtype).eval()

    ids = torch.randint(1, 128, (3, 24), device=device)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0   # left padding, as for generation
    mask[2, :17] = 0
    ids = ids.masked_fill(mask == 0, 0)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = {impl: m(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
                  for impl, m in models.items()}
    real = mask.bool()
    diff = (logits[name] - logits["sdpa"])[real].abs().max().item()
    print(f"kernelops vs sdpa on {device} ({dtype}): max |logit difference| over real tokens {diff:.2e}")

    tokens = {impl: m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
              for impl, m in models.items()}
    same = torch.equal(tokens[name], tokens["sdpa"])
    print(f"greedy generate, 8 new tokens: kernelops {tokens[name][:, -8:].tolist()}, same as sdpa: {same}")
    return {"max_logit_diff": diff, "tokens": tokens, "same": same, "dtype": dtype}


if __name__ == "__main__":
    main()
