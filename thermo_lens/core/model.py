"""ModelView: the one place that knows how a TransformerLens model is laid out.

Everything downstream (tokens, the pass, measures, results) reads geometry, block layout, hook
names, weights and the tokenizer from a :class:`ModelView`, never from the model directly; the view
never computes a measure. It wraps every supported host (:mod:`thermo_lens.core.host`): a
``TransformerBridge`` (TransformerLens 3.x / 4.x), a legacy ``HookedTransformer`` or SAELens
``HookedSAETransformer`` (TransformerLens 2.16.x / 3.x), a ``HookedEncoder``, with SAEs spliced in
read at their output (:mod:`thermo_lens.core.attached`). The view itself is host-agnostic: every answer
that depends on the host class comes from the host's adapter (:mod:`thermo_lens.core.hosts`).
Tokenization lives in :mod:`thermo_lens.core.tokens`.

Conventions (TransformerLens):

* residual states ``x_0 = blocks.0.hook_resid_pre`` and ``x_l = blocks.{l-1}.hook_resid_post``
  for ``l = 1..L``, read where the next block reads them (``blocks.{l}.hook_resid_pre``, the same
  tensor unless an SAE or a hook replaces it in between: see :attr:`ModelView.resid_hook_names`);
  the final norm is never part of any ``x_l`` (``thermo_lens.definitions`` §1);
* ``W_V[layer, kv_head]`` is ``[d_model, d_head]`` (``v = x @ W_V``) and ``W_O[layer, head]`` is
  ``[d_head, d_model]``; with grouped-query attention ``W_V`` has ``n_kv_heads`` heads and query
  head ``h`` reads KV head ``kv_head_of[h] = h // (n_heads // n_kv_heads)``.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, cast

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from thermo_lens.core import offload
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.host import Host, detect_host
from thermo_lens.core.hosts import HostAdapter
from thermo_lens.core.layout import BlockLayout, detect_layout

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["ModelView", "as_view", "kv_head_map", "PROCESSING_STEPS"]

#: TransformerLens' weight-processing steps thermo-lens detects (:attr:`ModelView.weight_processing`)
#: and what each does to the weights.
PROCESSING_STEPS: dict[str, str] = {
    "fold_ln": "LayerNorm folded into W_V (each row scaled by the LayerNorm weight, then centred over d_model; "
               "its bias into b_Q, b_K, b_V)",
    "center_writing_weights": "writing weights centred (W_O, W_out, W_E, W_pos and their biases lose their "
                              "mean over d_model, and so does the residual stream)",
    "center_unembed": "W_U centred over the vocabulary (changes no residual state)",
    "fold_value_biases": "value biases folded into b_O (b_V = 0; b_O gains sum_h b_V^h W_O^h)",
}

# HF model types whose blocks end in a LayerNorm on the residual stream (post-LN).
_POST_LN_MODEL_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert",
     "ernie", "mpnet", "deberta", "deberta-v2", "megatron-bert", "nezha", "rembert"}
)
# HF model types whose blocks run attention and MLP in parallel on the same input.
_ALWAYS_PARALLEL_MODEL_TYPES = frozenset({"gptj", "codegen", "phi", "cohere", "gpt_neox_japanese"})




class _StopForward(Exception):
    """Raised by the hook :meth:`ModelView.run` appends at ``stop_after``: ends the pass there."""


def _stop_forward(act: Tensor, hook: object = None) -> None:
    raise _StopForward


def _bridge_class_hint() -> str:
    return (
        "Pass a TransformerLens model: `from transformer_lens.model_bridge import "
        "TransformerBridge; model = TransformerBridge.boot_transformers('gpt2')` "
        "(or a local checkpoint directory). To wrap a HuggingFace model you already loaded: "
        "`TransformerBridge.boot_transformers('<name or dir>', hf_model=hf_model)`. "
        "For the embedded default models: `thermo_lens.zoo.load('gpt2-tiny-wd')`."
    )


def _check_model(model: TransformerLensModel | ModelView) -> None:
    if isinstance(model, ModelView):
        return
    if type(model).__name__ in ("HookedEncoderDecoder", "HookedAudioEncoder"):
        detect_host(model)  # raises UnsupportedHostError with what to load instead
    if model is None:
        raise TypeError(f"thermo-lens got None instead of a model. {_bridge_class_hint()}")
    if isinstance(model, (str, bytes)):
        raise TypeError(
            f"thermo-lens got the string {model!r} instead of a loaded model; thermo-lens does "
            f"not load models by name here. {_bridge_class_hint()}"
        )
    cls = type(model)
    module = cls.__module__ or ""
    if module.startswith("transformers.") and not hasattr(model, "run_with_hooks"):
        raise TypeError(
            f"thermo-lens got a raw HuggingFace model ({cls.__name__}); it needs TransformerLens "
            f"hook points. {_bridge_class_hint()}"
        )
    needed = ("cfg", "run_with_hooks", "blocks", "tokenizer")
    missing = [a for a in needed if not hasattr(model, a)]
    if missing:
        raise TypeError(
            f"thermo-lens got a {cls.__module__}.{cls.__name__}, which is not a TransformerLens "
            f"model (missing {', '.join(missing)}). {_bridge_class_hint()}"
        )


def as_view(model: TransformerLensModel | ModelView) -> "ModelView":
    """Return ``model`` as a :class:`ModelView` (a ModelView is returned unchanged)."""
    return model if isinstance(model, ModelView) else ModelView(model)


class ModelView:
    """Read-only view of a TransformerLens model's geometry, block layout, weights and hook names.

    Args:
        model: a ``transformer_lens.model_bridge.TransformerBridge`` (TransformerLens 3.x / 4.x),
            a ``HookedTransformer`` / SAELens ``HookedSAETransformer`` (TransformerLens 2.16.x /
            3.x), or a duck-typed host (``cfg``, ``blocks``, ``run_with_hooks``, ``tokenizer``).

    Attributes:
        n_layers, n_heads, n_kv_heads, d_model, d_head: geometry from the config (``d_head`` is
            the configured head size, never ``d_model // n_heads``: Gemma-7B has 256, not 192).
        n_ctx: context length.
        d_vocab: vocabulary size (token ids are checked against it), None when the config has none.
        norm_placement: ``"pre"`` (pre-LN: block output = residual + sublayers), ``"post"``
            (post-LN: the block output is a LayerNorm output, BERT / OPT-350m), or ``"none"``.
        post_ln: ``norm_placement == "post"``.
        parallel_attn: attention and MLP read the same block input (GPT-J, GPT-NeoX/Pythia).
        layout: the :class:`~thermo_lens.core.layout.BlockLayout` of every block: pre-LN, parallel,
            sandwich (norms after the sublayers), post-LN, with its residual multiplier and
            mixture of experts (``thermo_lens.definitions`` §7).
        weight_processing: the TransformerLens weight-processing steps the weights show
            (:data:`PROCESSING_STEPS`: ``fold_ln``, ``center_writing_weights``, ``center_unembed``,
            ``fold_value_biases``), detected from the weights on every host (compatibility mode,
            legacy ``from_pretrained``, or ``load_and_process_state_dict``, which folds value
            biases by default); ``()`` for raw weights (the bridge default, what the paper used).
        weights_processed: ``bool(weight_processing)``.
        backend: ``"bridge"``, ``"hooked_transformer"`` (HookedTransformer and SAELens'
            HookedSAETransformer) or ``"hooked_encoder"`` (BERT's ``HookedEncoder``).
        host: the :class:`~thermo_lens.core.host.Host` (class, TransformerLens version); a model from an
            unsupported TransformerLens release raises
            :class:`~thermo_lens.core.host.UnsupportedHostError`.
        adapter: the host's :class:`~thermo_lens.core.hosts.HostAdapter` (``host.adapter``): the view
            asks it every host-specific question (hook names, weights, layout, tokens).
        saes: the SAEs attached to the model (``add_sae``), read live: see :meth:`sae_records`.
    """

    def __init__(self, model: TransformerLensModel | ModelView):
        _check_model(model)
        if isinstance(model, ModelView):  # pragma: no cover - as_view handles this
            model = model.model
        self.model: TransformerLensModel = model
        cfg = model.cfg
        self.host: Host = detect_host(model)
        self.adapter: HostAdapter = self.host.adapter
        self.backend: str = self.adapter.backend
        self.n_layers: int = int(cfg.n_layers)
        self.n_heads: int = int(cfg.n_heads)
        n_kv = getattr(cfg, "n_key_value_heads", None)
        self.n_kv_heads: int = int(n_kv) if n_kv else self.n_heads
        self.d_model: int = int(cfg.d_model)
        self.d_head: int = int(cfg.d_head)
        self.n_ctx: int = int(cfg.n_ctx)
        vocab = getattr(cfg, "d_vocab", None)
        self.d_vocab: int | None = int(vocab) if isinstance(vocab, int) and vocab > 0 else None
        if self.n_heads % self.n_kv_heads:
            raise ThermoLensInputError(
                f"n_heads={self.n_heads} is not a multiple of n_key_value_heads={self.n_kv_heads}"
            )
        self.hf_config = self._hf_config()
        self.model_type: str | None = getattr(self.hf_config, "model_type", None)
        self.norm_placement: str = self._detect_norm_placement()
        self.post_ln: bool = self.norm_placement == "post"
        self.parallel_attn: bool = self._detect_parallel()
        self.weight_processing: tuple[str, ...] = self._detect_processing()
        self.weights_processed: bool = bool(self.weight_processing)
        name = str(getattr(cfg, "model_name", None) or type(model).__name__)
        # A local checkpoint's cfg.model_name is its path; its directory name reads better.
        self.name: str = Path(name).name if name.startswith(("/", ".", "~")) else name
        self.layout: BlockLayout = detect_layout(model, self.adapter, self.hf_config, self.norm_placement,
                                                 self.parallel_attn, self.name)

    # ------------------------------------------------------------------ metadata
    def _hf_config(self) -> PretrainedConfig | None:
        return self.adapter.hf_config(self.model)

    def _detect_norm_placement(self) -> str:
        cfg, hf = self.model.cfg, self.hf_config
        if getattr(cfg, "normalization_type", "LN") is None:
            return "none"
        if hf is not None:
            if self.model_type in _POST_LN_MODEL_TYPES:
                return "post"
            # OPT-350m: do_layer_norm_before=False puts the LayerNorm after each sublayer.
            if getattr(hf, "do_layer_norm_before", True) is False:
                return "post"
            if getattr(hf, "apply_residual_connection_post_layernorm", False):
                return "post"  # BLOOM option: the residual itself is taken after ln
        arch = str(getattr(cfg, "original_architecture", "") or getattr(cfg, "architecture", "") or "")
        if arch.startswith(("Bert", "Roberta", "Electra", "DistilBert")):
            return "post"
        return "pre"

    def _detect_parallel(self) -> bool:
        hf = self.hf_config
        if hf is not None:
            if self.model_type in _ALWAYS_PARALLEL_MODEL_TYPES:
                return True
            if self.model_type == "gpt_neox":
                return bool(getattr(hf, "use_parallel_residual", True))
            if self.model_type == "falcon":
                return bool(getattr(hf, "parallel_attn", True)) or bool(getattr(hf, "new_decoder_architecture", False))
        return bool(getattr(self.model.cfg, "parallel_attn_mlp", False))

    # ------------------------------------------------------------------ weight processing
    def _detect_processing(self) -> tuple[str, ...]:
        """Which of TransformerLens' weight-processing steps the weights show, read from the weights
        themselves on every host (``HookedTransformer.from_pretrained`` and
        ``load_and_process_state_dict`` record none of them; the bridge records only that
        ``process_weights`` ran): a subset of :data:`PROCESSING_STEPS`, in that order.

        * ``fold_ln``: the block's first LayerNorm has no affine weights left (``LNPre`` /
          ``RMSPre`` on ``HookedTransformer``; identity weights on a processed bridge);
        * ``center_writing_weights``: every row of block 0's ``W_O`` has mean 0 over ``d_model``;
        * ``center_unembed``: every row of ``W_U`` has mean 0 over the vocabulary;
        * ``fold_value_biases``: ``b_V`` is exactly 0 while ``b_O`` is not (the value biases
          moved into the output bias; a model without attention biases shows nothing).

        Only a few rows are read (cheap on any model); a raw model's rows have means of order
        ``rms / sqrt(d)``, a centred one's are float rounding.
        """
        model = self.model
        if not self.adapter.may_be_processed(model):
            return ()  # e.g. a raw bridge, or HookedEncoder (its post-LN norms cannot be folded)
        steps = []
        if self.adapter.ln_folded(model):
            steps.append("fold_ln")
        try:
            with self.adapter.materialised(self._attn(0), "block 0's W_O"):
                w_o = self._as_heads(cast(Tensor, self._attn(0).W_O), self.n_heads, (self.d_head, self.d_model), "W_O", 0)
            if _centred(w_o.reshape(-1, self.d_model)[:64]):
                steps.append("center_writing_weights")
        except (AttributeError, RuntimeError, TypeError):  # an attention layout without W_O
            pass
        try:
            w_u = getattr(model, "W_U", None)
        except (AttributeError, RuntimeError, TypeError):
            w_u = None
        if isinstance(w_u, Tensor) and w_u.ndim == 2 and _centred(w_u[:16].detach()):
            steps.append("center_unembed")
        attn = self._attn(0)
        b_v = getattr(attn, "_b_V", None)
        if b_v is None:
            b_v = getattr(attn, "b_V", None)
        b_o = getattr(attn, "b_O", None)
        if isinstance(b_v, Tensor) and isinstance(b_o, Tensor) and b_v.numel() and \
                not bool(b_v.detach().any()) and bool(b_o.detach().any()):
            steps.append("fold_value_biases")
        return tuple(steps)

    def warn_if_processed(self, effect: str, stacklevel: int = 2) -> None:
        """Warn, when the weights are processed, what that changes (``effect``) and how to get raw
        weights. ``stacklevel`` is as for ``warnings.warn`` from the caller's point of view."""
        if not self.weights_processed:
            return
        done = [PROCESSING_STEPS[s] for s in self.weight_processing]
        warnings.warn(
            f"{self.name}: the weights are processed ({', '.join(self.weight_processing) or 'process_weights'}); "
            f"processed weights have {'; '.join(done) or 'been changed by TransformerLens'}, so {effect}. "
            "The paper used raw weights: boot with TransformerBridge.boot_transformers(name) without "
            "enable_compatibility_mode() (legacy TransformerLens: "
            "HookedTransformer.from_pretrained_no_processing(name)). Results record weights='processed' "
            "and the steps (weight_processing).",
            UserWarning,
            stacklevel=stacklevel + 1,
        )

    @property
    def weight_state(self) -> str:
        """``"raw"`` or ``"processed"``."""
        return "processed" if self.weights_processed else "raw"

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the model's parameters (its compute dtype)."""
        for p in self.model.parameters():
            if p.is_floating_point():
                return p.dtype
        return getattr(self.model.cfg, "dtype", torch.float32)

    @property
    def device(self) -> torch.device:
        """Where the pass starts (tokens and masks go here): the execution device of a dispatched or
        offloaded model (whose parameters may sit on ``meta``), else the first parameter's device.
        Inside :meth:`pinned_device`, the device found when it was entered."""
        pinned = getattr(self, "_pinned_device", None)
        if pinned is not None:
            return pinned
        dev = offload.execution_device(self.model)
        if dev is not None:
            return dev
        for p in self.model.parameters():
            return p.device
        return torch.device(getattr(self.model.cfg, "device", "cpu") or "cpu")

    @contextlib.contextmanager
    def pinned_device(self) -> Iterator[torch.device]:
        """:attr:`device` looked up once for the duration (a pass of many batches: for a dispatched
        model the lookup walks every module, 26 walks per GPT-2-small profile, 3% of its pass)."""
        before: torch.device | None = getattr(self, "_pinned_device", None)
        device = self.device
        self._pinned_device: torch.device | None = device
        try:
            yield device
        finally:
            self._pinned_device = before

    @property
    def tokenizer(self) -> Any:  # the host's (a PreTrainedTokenizerBase), or None for a host without one
        return self.model.tokenizer

    def metadata(self) -> dict[str, Any]:
        """Geometry and state as a JSON-ready dict (recorded in every result)."""
        return {
            "name": self.name,
            "model_type": self.model_type,
            "backend": self.backend,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "n_ctx": self.n_ctx,
            "rho": self.n_heads / self.d_head,
            "norm_placement": self.norm_placement,
            "post_ln": self.post_ln,
            "parallel_attn": self.parallel_attn,
            "block_layout": self.layout.metadata(),
            "weights": self.weight_state,
            "weight_processing": list(self.weight_processing),
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
            "host": self.host.describe(),
            "saes": self.adapter.sae_records(self.model),
        }

    def __repr__(self) -> str:
        return (
            f"ModelView({self.name!r}: L={self.n_layers}, H={self.n_heads}, H_kv={self.n_kv_heads}, "
            f"d_model={self.d_model}, d_head={self.d_head}, {self.layout.describe()}, weights {self.weight_state}"
            f"{' (' + ', '.join(self.weight_processing) + ')' if self.weight_processing else ''}, "
            f"{str(self.dtype).replace('torch.', '')}, {self.device})"
        )

    # ------------------------------------------------------------------ hook names
    @property
    def resid_hook_names(self) -> tuple[str, ...]:
        """Hook names of the residual states ``x_0 .. x_L`` (``L + 1`` names): ``x_l`` is read where
        block ``l`` reads it, ``blocks.{l}.hook_resid_pre`` (``l < L``), and ``x_L`` at
        ``blocks.{L-1}.hook_resid_post``.

        Without hooks ``blocks.{l}.hook_resid_pre`` is the same tensor as
        ``blocks.{l-1}.hook_resid_post``. Anything that replaces the stream between two blocks (an
        SAE spliced in with SAELens, or a hook, at ``blocks.{l-1}.hook_resid_post`` or
        ``blocks.{l}.hook_resid_pre``) therefore lands in ``x_l``: block ``l``'s gain is measured
        against the stream it actually read, block ``l-1``'s gain includes the replacement, and
        the block gains telescope, ``prod_l G_l = ||x_L|| / ||x_0||`` (token scopes ``last`` and
        ``frobenius``), with SAEs and hooks alike. A replacement at ``blocks.0.hook_resid_pre``
        is part of ``x_0``. :meth:`run` reads a hook point that carries an SAE at the SAE's output
        (``<hook>.hook_sae_output``): the residual stream the model carries downstream.
        On ``HookedEncoder`` (BERT), whose ``hook_resid_post`` is taken before the block's last
        LayerNorm, ``x_L`` is that norm's output ``blocks.{L-1}.hook_normalized_resid_post`` (and
        ``blocks.{l}.hook_resid_pre`` is ``blocks.{l-1}.hook_normalized_resid_post``): the stream
        the next block receives, as on every other host.
        """
        L = self.n_layers
        post = self.adapter.resid_out_point
        return tuple([f"blocks.{l}.hook_resid_pre" for l in range(L)] + [f"blocks.{L - 1}.{post}"])

    def pattern_hook_name(self, layer: int) -> str:
        """Hook giving the attention pattern ``[batch, head, query_pos, key_pos]`` of a layer."""
        return f"blocks.{layer}.attn.hook_pattern"

    @property
    def pattern_hook_names(self) -> tuple[str, ...]:
        return tuple(self.pattern_hook_name(l) for l in range(self.n_layers))

    @property
    def hook_names(self) -> dict[str, tuple[str, ...]]:
        """Every hook point thermo-lens reads, by role."""
        return {"resid": self.resid_hook_names, "pattern": self.pattern_hook_names}

    # ------------------------------------------------------------------ weights
    @property
    def kv_head_of(self) -> Int[Tensor, " head"]:
        """KV head read by each query head (``repeat_interleave`` layout, as HF and TL use)."""
        return kv_head_map(self.n_heads, self.n_kv_heads)

    def _attn(self, layer: int) -> torch.nn.Module:
        return self.adapter.attention(self.model, layer)

    def _layers(self, layers: Sequence[int] | None) -> list[int]:
        if layers is None:
            return list(range(self.n_layers))
        out = [int(l) for l in layers]
        bad = [l for l in out if not -self.n_layers <= l < self.n_layers]
        if bad:
            raise ThermoLensInputError(f"layer(s) {bad} out of range: {self.name} has layers 0..{self.n_layers - 1} "
                                       "(negative indices count from the end)")
        return [l % self.n_layers for l in out]

    def _input_weights(self, name: str, dtype: torch.dtype, layers: Sequence[int] | None) -> Tensor:
        return torch.stack([self.stored_weights(name, l) for l in self._layers(layers)]).to(dtype)

    def stored_weights(self, name: str, layer: int, device: torch.device | str | None = "cpu") -> Tensor:
        """One layer's ``W_Q`` ``[head, d_model, d_head]``, ``W_K`` / ``W_V`` ``[kv_head, d_model,
        d_head]`` or ``W_O`` ``[head, d_head, d_model]`` as the model stores it: detached, on
        ``device`` (default CPU; ``None``: where the model keeps it, so a GPU model's weights never
        make a round trip through the host), in the model's own dtype and, where TransformerLens
        exposes one, a view of the parameter (no copy: read it, never write to it). For reading a
        large model a layer at a time; :meth:`W_V` and the others return stacked copies."""
        if name not in ("W_Q", "W_K", "W_V", "W_O"):
            raise ThermoLensInputError(f"stored_weights reads 'W_Q', 'W_K', 'W_V' or 'W_O', got {name!r}")
        l = self._layers([layer])[0]
        attn = self._attn(l)
        with self.adapter.materialised(attn, f"layer {l}'s {name}"):  # an offloaded layer, loaded for this read
            if name == "W_O":
                return self._as_heads(self.adapter.module_weight(attn, "W_O"), self.n_heads, (self.d_head, self.d_model),
                                      "W_O", l, device)
            w = self.adapter.attn_weight(attn, name)
            return self._as_heads(w, self.n_heads if name == "W_Q" else self.n_kv_heads, (self.d_model, self.d_head),
                                  name, l, device)

    def W_V(self, dtype: torch.dtype = torch.float32, layers: Sequence[int] | None = None
            ) -> Float[Tensor, "layer kv_head d_model d_head"]:
        """Value weights per layer and KV head, detached, on CPU, in ``dtype`` (float32).

        ``layers`` selects layers (default all); the first dimension then follows ``layers``.
        """
        return self._input_weights("W_V", dtype, layers)

    def W_K(self, dtype: torch.dtype = torch.float32, layers: Sequence[int] | None = None
            ) -> Float[Tensor, "layer kv_head d_model d_head"]:
        """Key weights per layer and KV head (``k = x @ W_K``), detached, on CPU, in ``dtype``."""
        return self._input_weights("W_K", dtype, layers)

    def W_Q(self, dtype: torch.dtype = torch.float32, layers: Sequence[int] | None = None
            ) -> Float[Tensor, "layer head d_model d_head"]:
        """Query weights per layer and query head (``q = x @ W_Q``), detached, on CPU, in ``dtype``."""
        return self._input_weights("W_Q", dtype, layers)

    def W_O(self, dtype: torch.dtype = torch.float32, layers: Sequence[int] | None = None
            ) -> Float[Tensor, "layer head d_head d_model"]:
        """Output weights per layer and query head, detached, on CPU, in ``dtype``."""
        return self._input_weights("W_O", dtype, layers)

    def W_O_layers(self, dtype: torch.dtype = torch.float32) -> list[Tensor]:
        """``W_O`` of every layer, ``[head, d_head, d_model]`` each, in ``dtype``: views of the stored
        weights where the model keeps them in ``dtype`` (read them, never write to them), else copies
        one layer at a time. For a pass that reads ``W_O`` (the attribution, head write norms): no
        stacked copy of every layer (0.27 GB at 1B scale, 2 GiB at 7B)."""
        return [self.stored_weights("W_O", l).to(dtype) for l in range(self.n_layers)]

    def output_biases(self, layer: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor | None, Tensor | None]:
        """``(b_O, b_out)`` of block ``layer``: the attention output bias and the MLP output bias
        (``[d_model]``, detached, CPU), each None when the block has none (LLaMA, Gemma)."""
        out: list[Tensor | None] = []
        for mod, name in ((self._attn(layer), "b_O"), (getattr(self.adapter.blocks(self.model)[layer], "mlp", None), "b_out")):
            if mod is None:
                out.append(None)
                continue
            with self.adapter.materialised(mod, f"layer {layer}'s {name}"):
                b = self.adapter.module_weight(mod, name)
                out.append(None if b is None else b.detach().to("cpu", dtype).reshape(-1))
        return out[0], out[1]

    def W_V_per_query_head(self, dtype: torch.dtype = torch.float32) -> Float[Tensor, "layer head d_model d_head"]:
        """``W_V`` repeated from KV heads to query heads via :attr:`kv_head_of`."""
        return self.W_V(dtype)[:, self.kv_head_of]

    def _as_heads(self, w: Tensor, n: int, shape: tuple[int, int], what: str, layer: int,
                  device: torch.device | str | None = "cpu") -> Tensor:
        w = w.detach() if device is None else w.detach().to(device)
        if w.ndim == 3 and tuple(w.shape) == (n, *shape):
            return w
        # 2D layouts: [d_model, n * d_head] for W_Q/W_K/W_V, [n * d_head, d_model] for W_O.
        if w.ndim == 2 and what != "W_O" and tuple(w.shape) == (shape[0], n * shape[1]):
            return w.reshape(shape[0], n, shape[1]).permute(1, 0, 2)
        if w.ndim == 2 and what == "W_O" and tuple(w.shape) == (n * shape[0], shape[1]):
            return w.reshape(n, shape[0], shape[1])
        raise RuntimeError(
            f"layer {layer}: {what} has shape {tuple(w.shape)}, expected {(n, *shape)} from the "
            f"config (n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, d_model={self.d_model}, "
            f"d_head={self.d_head}). This architecture's attention layout is not supported yet."
        )

    # ------------------------------------------------------------------ running
    def run(self, tokens: Int[Tensor, "batch pos"], attention_mask: Bool[Tensor, "batch pos"],
            fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (), *, stop_after: str | None = None,
            return_logits: bool = False) -> Tensor | None:
        """One forward pass of ``tokens`` with ``fwd_hooks``; logits are discarded unless
        ``return_logits`` (then returned, ``[batch, pos, d_vocab]``; ``stop_after`` must be ``None``).

        The attention mask is passed so padded positions are masked for bidirectional models;
        right padding makes it a no-op on real tokens of causal models.

        ``stop_after``: a hook name; the pass ends right after that hook point has run every hook
        registered there (a hook appended last raises a private exception that this method
        catches), so what follows is not computed: for the last block's ``hook_resid_post``, the
        final norm and, on ``TransformerBridge`` (whose HF model computes logits even for
        ``return_type=None``), the unembedding, ``d_model x d_vocab`` per token, about a third of
        GPT-2-small's forward; ``HookedTransformer`` already skips its unembedding for
        ``return_type=None``. Only for passes whose hooks all fire before that point.
        """
        self.adapter.check_saes(self.model, self.name, self.d_model)
        device = self.device
        tokens = tokens.to(device)
        mask = attention_mask.to(device=device, dtype=torch.long)
        hooks = list(fwd_hooks)
        if stop_after is not None:
            hooks.append((stop_after, _stop_forward))
        if self.adapter.needs_resolving(self.model):
            hooks = [(self.adapter.resolve_hook(self.model, name, self.name), fn) for name, fn in hooks]
        with torch.inference_mode():
            mask_kw = self.adapter.mask_keyword  # the host's name for the 0/1 mask
            try:
                out = self.model.run_with_hooks(tokens, fwd_hooks=hooks,
                                                return_type="logits" if return_logits else None, **{mask_kw: mask})
            except _StopForward:
                return None
        if return_logits:
            return out.logits if hasattr(out, "logits") else out
        return None

    def last_hook_needed(self, hook_names: Sequence[str | Callable]) -> str | None:
        """The hook point after which a pass running hooks at ``hook_names`` may stop
        (:meth:`run`'s ``stop_after``): ``blocks.{l}.hook_resid_post`` of the deepest block ``l``
        named, the last hook point of that block, when every name is a block hook
        (``blocks.{l}.*``; a name filter or e.g. ``ln_final.*`` could fire later) and no SAE is
        attached (its hooks re-point names); else ``None`` (run to the end)."""
        if self.adapter.has_saes(self.model) or not hook_names:
            return None
        deepest = -1
        for name in hook_names:
            parts = name.split(".") if isinstance(name, str) else []
            if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
                return None
            deepest = max(deepest, int(parts[1]))
        return f"blocks.{min(deepest, self.n_layers - 1)}.{self.adapter.resid_out_point}"

def _centred(rows: Tensor) -> bool:
    """Whether every row of ``rows`` ``[n, d]`` has mean 0 up to float rounding (``|mean| <= 1e-3
    rms``; a raw weight row's mean is of order ``rms / sqrt(d)``). All-zero rows are skipped; no
    non-zero row: False."""
    r = rows.detach().to("cpu", torch.float64)
    rms = r.pow(2).mean(-1).sqrt()
    keep = rms > 0
    if not bool(keep.any()) or r.shape[-1] < 2:
        return False
    return bool((r.mean(-1).abs()[keep] <= 1e-3 * rms[keep]).all())


def kv_head_map(n_heads: int, n_kv_heads: int | None) -> Int[Tensor, " head"]:
    """KV head of each query head under grouped-query attention: ``h // (n_heads // n_kv_heads)``."""
    return torch.arange(n_heads) // max(n_heads // int(n_kv_heads or n_heads), 1)
