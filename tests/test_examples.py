"""Every example runs (small sizes, on whatever device is present) and does what it says it does.

Each script in ``examples/`` has a ``main()`` that prints for the reader and returns what the
test below checks; a new example needs a check here (test_every_example_has_a_check)."""

import pathlib
import runpy

import pytest
import torch

EXAMPLES = pathlib.Path(__file__).parents[1] / "examples"


def load(name: str) -> dict:
    """The example's module namespace (its ``if __name__ == "__main__"`` block not run)."""
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name=f"example_{name}")


def check_quickstart(capsys):
    result = load("quickstart")["main"]()
    # relative errors against float64; float32 on a CPU is ~1e-7 .. 1e-6, bfloat16 on a GPU ~1e-2
    tolerance = 1e-5 if result["dtype"] == torch.float32 else 3e-2
    assert set(result["errors"]) == {"out", "dq", "dk", "dv"}
    for name, err in result["errors"].items():
        assert err < tolerance, f"quickstart: {name} is {err:.2e} from float64 (tolerance {tolerance:.0e})"
    assert "config from" in capsys.readouterr().out  # the executor's explanation was printed


def check_hf_model(capsys):
    pytest.importorskip("transformers")
    result = load("hf_model")["main"]()
    tokens = result["tokens"]
    assert set(tokens) == {"kernelops", "sdpa"} and tokens["kernelops"].shape == (3, 24 + 8)
    assert torch.equal(tokens["kernelops"], tokens["sdpa"]) and result["same"], \
        f"greedy tokens differ: {tokens['kernelops'][:, -8:].tolist()} vs sdpa {tokens['sdpa'][:, -8:].tolist()}"
    bound = 1e-4 if result["dtype"] == torch.float32 else 0.25
    assert result["max_logit_diff"] < bound, f"logits differ from sdpa's by {result['max_logit_diff']:.2e}"
    assert "same as sdpa: True" in capsys.readouterr().out


def check_train_tiny_transformer(capsys):
    module = load("train_tiny_transformer")
    steps = 150  # the loss halves well within 150 steps on a CPU (the script's default is 300)
    result = module["main"](["--steps", str(steps)])
    assert len(result.losses) == steps
    assert result.last < module["LOSS_BOUND"] * result.first, \
        f"loss {result.first:.3f} -> {result.last:.3f}: not below {module['LOSS_BOUND']} x the first"
    assert result.went_down and "went down" in capsys.readouterr().out


def check_tuning_control(capsys):
    result = load("tuning_control")["main"]()
    selectors = result["selectors"]
    assert selectors["cfg"] == "explicit" and selectors["overlay"] == "overlay"
    # after the block the chain answers as before it (from memory once a plain call has run)
    assert selectors["plain"] != "overlay" and selectors["after overlay"] not in ("overlay", "explicit")
    assert selectors["policy=never"] != "autotune" and selectors["stored entry"] == "disk"
    assert set(result["errors"]) == {"cfg", "overlay", "stored entry"}
    assert all(err < result["tolerance"] for err in result["errors"].values()), result["errors"]
    assert "kernelops" in capsys.readouterr().out


def check_ship_tuned_cache(capsys):
    result = load("ship_tuned_cache")["main"]()
    assert result["exported"] == result["imported"] == 2
    assert "disk" not in result["before"] and result["after"] == ["disk", "disk"]
    assert result["tuned_configs"] == [True, True] and result["tampered_refused"]
    assert "refused" in capsys.readouterr().out


CHECKS = {name.removeprefix("check_"): fn for name, fn in globals().items() if name.startswith("check_")}


def test_every_example_has_a_check():
    scripts = {p.stem for p in EXAMPLES.glob("*.py")}
    assert scripts == set(CHECKS), f"examples without a check: {scripts - set(CHECKS)}; checks of no example: " \
                                   f"{set(CHECKS) - scripts}"
    for name in scripts:
        text = (EXAMPLES / f"{name}.py").read_text()
        assert 'if __name__ == "__main__":' in text and "def main(" in text, f"{name}.py is not a runnable script"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_example_does_what_it_says(name, capsys):
    CHECKS[name](capsys)
