"""attn_implementation="kernelops" in Hugging Face transformers models.

Tiny models built from configs with random weights (no downloads). The float64 reference is
the ``eager`` model in float64 run on each sequence alone, unpadded, so it does not share HF's
padding-mask code with the runs under test. The error rule is flash-attn's: the kernelops model's
error against that reference must stay within a small multiple of the error of HF's own
implementation (``sdpa``, or ``eager`` where sdpa is unsupported) in the same dtype, plus a floor
for float32 rounding.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernelops.integrations import transformers as hf_kernelops  # noqa: E402

NAME = hf_kernelops.register()
TRITON_NAME = hf_kernelops.register("kernelops_triton", platform="triton")
VOCAB = 61
# float32 error allowed on top of 2x the reference implementation's (relative to the output's scale)
FLOOR = {torch.float32: 2e-6, torch.bfloat16: 2e-2}
# gradients are reductions over every token and layer: float32 summed in another order differs by
# up to ~1e-5 of the largest gradient (with a 2e-6 floor one full CPU run failed at 8.8e-6 on fresh
# random inputs and passed on rerun); a real bug is >= 1e-3
GRAD_FLOOR = 1e-5


@dataclasses.dataclass
class Family:
    config: object
    auto_class: object
    baseline: str           # HF's implementation in the same dtype: the yardstick
    padding_side: str       # "left" for decoders (as in generation), "right" for encoders
    decoder: bool = True


def _common(**kw):
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                initializer_range=0.4, pad_token_id=0, **kw)


FAMILIES = {
    "llama": Family(transformers.LlamaConfig(**_common(num_key_value_heads=2, max_position_embeddings=64)),
                    transformers.AutoModelForCausalLM, "sdpa", "left"),
    "qwen3": Family(transformers.Qwen3Config(**_common(num_key_value_heads=1, head_dim=16, max_position_embeddings=64)),
                    transformers.AutoModelForCausalLM, "sdpa", "left"),
    # window 4 at length 13: most queries lose keys to it
    "mistral": Family(transformers.MistralConfig(**_common(num_key_value_heads=2, sliding_window=4,
                                                           max_position_embeddings=64)),
                      transformers.AutoModelForCausalLM, "sdpa", "left"),
    # layer 0 sliding (window 4), layer 1 full; a soft cap of 2 clips most logits at this init
    "gemma2": Family(transformers.Gemma2Config(**_common(num_key_value_heads=2, head_dim=16, sliding_window=4,
                                                         attn_logit_softcapping=2.0, query_pre_attn_scalar=16,
                                                         max_position_embeddings=64)),
                     transformers.AutoModelForCausalLM, "eager", "left"),  # Gemma 2 refuses sdpa (softcap)
    "bert": Family(transformers.BertConfig(**_common(max_position_embeddings=64, hidden_dropout_prob=0.0,
                                                     attention_probs_dropout_prob=0.0)),
                   transformers.AutoModelForMaskedLM, "sdpa", "right", decoder=False),
}


class Models:
    """One set of random weights, instantiated with any attn_implementation and dtype."""

    def __init__(self, family: Family, **config_overrides):
        self.family = family
        self.config = copy.deepcopy(family.config)
        for k, v in config_overrides.items():
            setattr(self.config, k, v)
        self.state = self._new("eager").state_dict()

    def _new(self, impl):
        # from_config writes the implementation into the config: each model gets its own copy
        return self.family.auto_class.from_config(copy.deepcopy(self.config), attn_implementation=impl)

    def get(self, impl, dtype=torch.float32, device="cpu", train=False):
        model = self._new(impl)
        model.load_state_dict(self.state)
        model = model.to(device=device, dtype=dtype)
        return model.train() if train else model.eval()


def make_batch(family: Family, lengths, device="cpu"):
    """Random ids ``[B, S]`` padded on the family's side, mask ``[B, S]``, position ids (decoders)."""
    S = max(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), S), device=device)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        if family.padding_side == "left":
            mask[i, S - n:] = 1
        else:
            mask[i, :n] = 1
    ids = ids.masked_fill(mask == 0, 0)
    positions = (mask.cumsum(-1) - 1).clamp_min(0) if family.decoder else None
    return ids, mask, positions


def _inputs(ids, mask, positions):
    kw = dict(input_ids=ids, attention_mask=mask)
    if positions is not None:
        kw["position_ids"] = positions
    return kw


def reference_run(models: Models, ids, mask, weights=None, device="cpu"):
    """float64 eager on each sequence alone: logits ``[B, S, V]`` (0 at padding) and, with
    ``weights [B, S, V]``, the parameter gradients of ``sum(logits * weights)`` over real tokens."""
    model = models.get("eager", torch.float64, device, train=weights is not None)
    logits = torch.zeros(*ids.shape, VOCAB, dtype=torch.float64, device=device)
    for i in range(ids.shape[0]):
        keep = mask[i].bool()
        seq = ids[i, keep][None]
        kw = dict(input_ids=seq)
        if models.family.decoder:
            kw["position_ids"] = torch.arange(seq.shape[1], device=device)[None]
        with torch.set_grad_enabled(weights is not None):
            out = model(**kw).logits[0]
            if weights is not None:
                (out * weights[i, keep].double()).sum().backward()
        logits[i, keep] = out.detach()
    grads = None if weights is None else {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits, grads


def run(models: Models, impl, ids, mask, positions, weights=None, dtype=torch.float32, device="cpu"):
    model = models.get(impl, dtype, device, train=weights is not None)
    with torch.set_grad_enabled(weights is not None):
        logits = model(**_inputs(ids, mask, positions)).logits
        if weights is not None:
            (logits.float() * weights * mask[..., None]).sum().backward()
    grads = None if weights is None else {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().double() * mask[..., None], grads


def assert_close_to_reference(got, baseline, ref, dtype, what, scale=None, floor=None):
    """flash-attn's rule: |got - ref| <= 2 |baseline - ref| + floor * scale (max norms; ``scale``
    defaults to max|ref|, ``floor`` to ``FLOOR[dtype]``)."""
    err = (got - ref).abs().max().item()
    base_err = (baseline - ref).abs().max().item()
    floor = FLOOR[dtype] if floor is None else floor
    bound = 2 * base_err + floor * (ref.abs().max().item() if scale is None else scale)
    assert err <= bound, f"{what}: kernelops error {err:.3g} > {bound:.3g} (baseline error {base_err:.3g})"


LENGTHS = {"unpadded": [13, 13], "padded": [13, 9, 4]}


@pytest.mark.parametrize("batch", list(LENGTHS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_float64_reference(family, batch):
    fam = FAMILIES[family]
    models = Models(fam)
    ids, mask, positions = make_batch(fam, LENGTHS[batch])
    ref, _ = reference_run(models, ids, mask)
    got, _ = run(models, NAME, ids, mask, positions)
    base, _ = run(models, fam.baseline, ids, mask, positions)
    assert_close_to_reference(got, base, ref, torch.float32, f"{family} {batch} logits")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradients_match_float64_reference(family):
    fam = FAMILIES[family]
    models = Models(fam)
    ids, mask, positions = make_batch(fam, [12, 7])
    weights = torch.randn(*ids.shape, VOCAB)
    _, ref = reference_run(models, ids, mask, weights)
    _, got = run(models, NAME, ids, mask, positions, weights)
    _, base = run(models, fam.baseline, ids, mask, positions, weights)
    assert set(got) == set(ref)
    # rounding in the backward scales with the largest gradients, not with each parameter's own
    # (a key bias's true gradient is 0: softmax ignores a per-row constant)
    scale = max(g.abs().max().item() for g in ref.values())
    for name in ref:
        assert_close_to_reference(got[name], base[name], ref[name], torch.float32, f"{family} grad of {name}", scale,
                                  GRAD_FLOOR)


def _generate(model, ids, mask, **kw):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("family", [f for f in FAMILIES if FAMILIES[f].decoder])
def test_greedy_generate_matches_baseline(family):
    fam = FAMILIES[family]
    models = Models(fam)
    ids, mask, _ = make_batch(fam, [11, 6, 8])
    want = _generate(models.get(fam.baseline), ids, mask)
    got = _generate(models.get(NAME), ids, mask)
    assert got.shape == want.shape == (3, 16)
    assert torch.equal(got, want)


def test_static_cache_generate_uses_full_masks():
    """A StaticCache's keys run past the queries' positions: bottom-right causal alignment would be
    wrong there, so the mask function hands over HF's 4-D mask instead (and the result matches)."""
    fam = FAMILIES["llama"]
    models = Models(fam)
    ids, mask, _ = make_batch(fam, [9, 5])
    want = _generate(models.get("sdpa"), ids, mask, cache_implementation="static")
    got = _generate(models.get(NAME), ids, mask, cache_implementation="static")
    assert torch.equal(got, want)


def test_packed_sequences_from_position_ids():
    """Documents packed in one row (position ids restart, no attention mask) get HF's block mask."""
    fam = FAMILIES["llama"]
    models = Models(fam)
    lengths = [5, 8, 3]
    ids = torch.randint(1, VOCAB, (1, sum(lengths)))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    model = models.get(NAME)
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=positions).logits.double()[0]
        base = models.get("sdpa")(input_ids=ids, position_ids=positions).logits.double()[0]
    ref64 = models.get("eager", torch.float64)
    starts = [0, 5, 13]
    with torch.no_grad():
        ref = torch.cat([ref64(input_ids=ids[:, s:s + n], position_ids=torch.arange(n)[None]).logits[0]
                         for s, n in zip(starts, lengths)])
    assert_close_to_reference(got, base, ref, torch.float32, "packed logits")


@pytest.mark.parametrize("family, override", [("mistral", {"sliding_window": None}),
                                              ("gemma2", {"attn_logit_softcapping": None}),
                                              ("gemma2", {"sliding_window": 4096})])
def test_features_matter_at_test_sizes(family, override):
    """The window and soft cap change the float64 reference far beyond the tolerances above, so
    the comparisons would catch an integration that dropped them."""
    fam = FAMILIES[family]
    models = Models(fam)
    ids, mask, _ = make_batch(fam, LENGTHS["padded"])
    with_feature, _ = reference_run(models, ids, mask)
    models.config = copy.deepcopy(models.config)
    for k, v in override.items():
        setattr(models.config, k, v)
    without, _ = reference_run(models, ids, mask)
    assert (with_feature - without).abs().max() > 1e-2 * with_feature.abs().max()


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_triton_kernels_in_a_model(family):
    """The same models on the Triton kernels (the interpreter on CPU, the GPU where there is one):
    padded float32 logits and greedy generate."""
    fam = FAMILIES[family]
    models = Models(fam)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids, mask, positions = make_batch(fam, [10, 6], device=device)
    ref, _ = reference_run(models, ids, mask, device=device)
    got, _ = run(models, TRITON_NAME, ids, mask, positions, device=device)
    base, _ = run(models, fam.baseline, ids, mask, positions, device=device)
    # on a GPU float32 dots are 3xTF32 (~1e-6 relative each): the suite's GPU float32 floor
    floor = 2e-5 if device == "cuda" else None
    assert_close_to_reference(got, base, ref, torch.float32, f"{family} triton logits", floor=floor)
    want = _generate(models.get(fam.baseline, device=device), ids, mask)
    assert torch.equal(_generate(models.get(TRITON_NAME, device=device), ids, mask), want)


# --- the attention function on its own -----------------------------------------------------------

def _module(is_causal=True):
    m = torch.nn.Module()
    m.is_causal = is_causal
    return m


def _dense_reference(q, k, v, keep, scale, softcap=None, sinks=None):
    """float64 softmax attention on [B, H, S, D] with a boolean keep mask [B, 1, Sq, Sk]."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None, None].expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1)[..., :k.shape[2]]
    return (p @ v).transpose(1, 2)


@pytest.mark.parametrize("causal, window", [(True, None), (True, 3), (False, None), (False, 2)])
def test_attention_forward_band_and_padding(causal, window):
    B, Hq, Hkv, Sq, Sk, D = 2, 4, 2, 5, 9, 16  # Sq < Sk: queries are the last Sq positions (a KV cache)
    q, k, v = torch.randn(B, Hq, Sq, D), torch.randn(B, Hkv, Sk, D), torch.randn(B, Hkv, Sk, D)
    pad = torch.ones(B, Sk, dtype=torch.bool)
    pad[1, :3] = False
    out, weights = hf_kernelops.attention_forward(_module(causal), q, k, v, pad, scaling=0.3, sliding_window=window)
    assert weights is None and out.shape == (B, Sq, Hq, D)
    qi = torch.arange(Sq)[:, None] + Sk - Sq  # absolute query positions
    kj = torch.arange(Sk)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        keep &= kj <= qi
    if window is not None:  # HF's overlays: causal kv > q - w, bidirectional |q - kv| <= w
        keep &= (kj > qi - window) if causal else ((qi - kj).abs() <= window)
    keep = keep[None, None] & pad[:, None, None, :]
    ref = _dense_reference(q, k, v, keep, 0.3)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_attention_forward_4d_masks_softcap_sinks_and_narrow_value():
    B, Hq, Hkv, S, D, Dv = 2, 4, 1, 7, 16, 8
    q, k, v = torch.randn(B, Hq, S, D) * 3, torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, Dv)
    keep = torch.rand(B, 1, S, S) > 0.4
    keep[..., 0] = True  # every row sees a key
    sinks = torch.randn(Hq)
    v_padded = torch.nn.functional.pad(v, (0, D - Dv))
    ref = _dense_reference(q, k, v_padded, keep, 0.25, softcap=2.0, sinks=sinks)[..., :Dv]
    module = _module(True)  # a 4-D mask holds the pattern: the module's causal flag is not applied
    for mask in (keep, torch.zeros(B, 1, S, S).masked_fill(~keep, torch.finfo(torch.float32).min)):
        out, _ = hf_kernelops.attention_forward(module, q, k, v, mask, scaling=0.25, softcap=2.0, s_aux=sinks)
        assert out.shape == (B, S, Hq, Dv)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_attention_forward_rejects_bad_input():
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(ValueError, match="query"):
        hf_kernelops.attention_forward(_module(), q[0], q, q, None)
    with pytest.raises(ValueError, match=r"attention_mask.shape=\(1, 3\)"):
        hf_kernelops.attention_forward(_module(), q, q, q, torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="attention_mask.dtype"):
        hf_kernelops.attention_forward(_module(), q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.int64))
    with pytest.raises(NotImplementedError, match="position_bias"):
        hf_kernelops.attention_forward(_module(), q, q, q, None, position_bias=torch.zeros(1, 2, 4, 4))
    with pytest.raises(ValueError, match="name"):
        hf_kernelops.register("org/repo")


def test_register_is_idempotent():
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    before = dict(AttentionInterface._global_mapping)
    assert hf_kernelops.register() == NAME
    assert AttentionInterface._global_mapping == before
    assert hf_kernelops.is_registered(NAME) and hf_kernelops.is_registered(TRITON_NAME)
    assert AttentionMaskInterface._global_mapping[NAME] is hf_kernelops.kernelops_mask


def test_mask_function_keeps_compact_masks_only_where_exact():
    from transformers import masking_utils as mu

    pad = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    # prefill and dynamic-cache decode (queries end where the keys end): None or the padding mask
    assert hf_kernelops.kernelops_mask(2, 6, 6, attention_mask=torch.ones_like(pad)) is None
    assert torch.equal(hf_kernelops.kernelops_mask(2, 1, 6, q_offset=5, attention_mask=pad), pad)
    sliding = mu.sliding_window_causal_mask_function(3)  # a sliding cache holding keys 3..5
    late_pad = torch.tensor([[1, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(hf_kernelops.kernelops_mask(2, 1, 3, q_offset=5, kv_offset=3, mask_function=sliding,
                                                   attention_mask=late_pad), late_pad[:, 3:])
    # a StaticCache (keys past the queries) and packed / custom patterns: HF's full 4-D mask
    static = hf_kernelops.kernelops_mask(2, 2, 8, q_offset=3, attention_mask=pad)
    assert static.shape == (2, 1, 2, 8) and not static[0, 0, 0, 4:].any() and static[1, 0, 1, :5].all()
    custom = mu.and_masks(mu.causal_mask_function, lambda b, h, q, kv: kv != 2)
    assert hf_kernelops.kernelops_mask(2, 6, 6, mask_function=custom).shape == (2, 1, 6, 6)


# --- GPU: bf16 on CUDA, the Triton kernels through "auto" ----------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gpu_bf16_logits_gradients_and_generate(family):
    fam = FAMILIES[family]
    models = Models(fam)
    ids, mask, positions = make_batch(fam, [40, 23, 31], device="cuda")
    weights = torch.randn(*ids.shape, VOCAB, device="cuda")
    ref, ref_grads = reference_run(models, ids, mask, weights, device="cuda")
    got, got_grads = run(models, NAME, ids, mask, positions, weights, torch.bfloat16, "cuda")
    base, base_grads = run(models, fam.baseline, ids, mask, positions, weights, torch.bfloat16, "cuda")
    assert_close_to_reference(got, base, ref, torch.bfloat16, f"{family} bf16 logits")
    scale = max(g.abs().max().item() for g in ref_grads.values())
    for name in ref_grads:
        assert_close_to_reference(got_grads[name], base_grads[name], ref_grads[name], torch.bfloat16,
                                  f"{family} bf16 grad of {name}", scale)
    if fam.decoder:  # float32 on the GPU: bf16 greedy decoding is too close to ties to compare tokens
        want = _generate(models.get(fam.baseline, device="cuda"), ids, mask)
        assert torch.equal(_generate(models.get(NAME, device="cuda"), ids, mask), want)
