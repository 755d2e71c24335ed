"""Session fixtures: tiny random local checkpoints of every supported architecture.

Nothing here touches a network: checkpoints are built from configs and saved locally, then
booted with ``TransformerBridge.boot_transformers(path)`` exactly as a hub model would be.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import torch

# Tiny models: one thread is faster than two and immune to a busy second core.
torch.set_num_threads(1)

from thermo_lens.testing import ARCHITECTURES, FAST_ARCHITECTURES, make_checkpoint


def pytest_configure(config):
    # The fast loop deselects the slow tier: property tests there run fewer examples (tests/tiers.py).
    markexpr = (config.getoption("markexpr", "") or "").replace(" ", "")
    if markexpr == "notslow":
        os.environ["THERMO_LENS_TEST_TIER"] = "fast"
    else:
        os.environ.pop("THERMO_LENS_TEST_TIER", None)

# The fast tier's architectures; the slow tier's matrix (tests/models/test_architectures.py) boots the rest.
ARCHS = FAST_ARCHITECTURES
# Architectures with causal attention (all but BERT).
CAUSAL_ARCHS = tuple(a for a in ARCHS if a != "bert")


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """``checkpoint_dir(arch)`` -> path of a tiny random checkpoint, built once per session."""
    root = tmp_path_factory.mktemp("checkpoints")
    made = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = make_checkpoint(arch, root / arch)
        return made[arch]

    return get


@pytest.fixture(scope="session")
def bridge(checkpoint_dir):
    """``bridge(arch)`` -> a TransformerBridge booted offline from the tiny checkpoint (cached)."""
    booted = {}

    def get(arch: str):
        # Imported here: TransformerLens 2.x (a legacy host leg) has no model_bridge.
        from transformer_lens.model_bridge import TransformerBridge

        if arch not in booted:
            torch.manual_seed(0)
            # On the CPU: the host's default is a GPU where there is one, and the tests compare
            # with CPU computations (tests/scale/test_cuda.py boots on the GPU on purpose).
            booted[arch] = TransformerBridge.boot_transformers(str(checkpoint_dir(arch)), device="cpu")
        return booted[arch]

    return get


@pytest.fixture(scope="session")
def hf_model(checkpoint_dir):
    """``hf_model(arch)`` -> the same checkpoint loaded as a plain HF model (eager attention)."""
    import transformers

    loaded = {}

    def get(arch: str):
        if arch not in loaded:
            cls = getattr(transformers, ARCHITECTURES[arch][1])
            loaded[arch] = cls.from_pretrained(
                str(checkpoint_dir(arch)), attn_implementation="eager"
            ).eval()
        return loaded[arch]

    return get
