"""Exact per-head attribution of the residual stream's squared-norm change, block by block.

Block ``layer`` (0-based, ``blocks.{layer}``) maps its input ``x_in = x_layer`` to its output
``x_out = x_{layer+1}`` (the residual states of :mod:`thermo_lens.measures.gain`). Since
``||x_out||^2 - ||x_in||^2 = <x_out - x_in, s>`` with ``s = x_out + x_in``, any exact split of
``x_out - x_in`` into components ``c`` splits the squared-norm change exactly into one term per
component, ``<c, s>`` per token. In a pre-LN block (sequential or parallel attention: GPT-2,
GPT-NeoX/Pythia, LLaMA, GPT-J ...)::

    x_out = x_in + sum_h z_h W_O^h + b_O + (mlp_out - b_out) + b_out

so ``head[..., h] = <z_h W_O^h, s>``, ``mlp = <mlp_out - b_out, s>``, ``bias = <b_O + b_out, s>``,
``total = ||x_out||^2 - ||x_in||^2`` and ``head.sum(-1) + mlp + bias == total`` up to float32
rounding, token by token and therefore for every mean over tokens. The block gain is
``sqrt(||x_out||^2 / ||x_in||^2)``, so ``total > 0`` exactly when the block's gain exceeds 1 on
that token.

What a term is, and is not (``thermo_lens.definitions`` §1). Writing ``x_out = x_in + sum_c c``,
``||x_out||^2 - ||x_in||^2 = sum_c (2 <c, x_in> + ||c||^2) + sum_{c != c'} <c, c'>``; the term
``<c, x_out + x_in>`` gives component ``c`` its own part and *half* of each cross term ``<c, c'>``:
it is the Shapley value of the squared-norm change when every component's output is held at its
value in this run. It is **not an ablation effect**: removing ``c`` (the others held fixed)
changes the squared norm by ``2 <c, x_in> + ||c||^2 + 2 sum_{c'} <c, c'>``, which differs from the
share by the other half of the cross terms, and in a real ablation later sublayers also react.
The two can have opposite signs: two heads that write opposite directions (``o_1 = -0.75 o_0``)
give head 0 a positive share although ablating it *raises* the norm
(``tests/measures/test_attribution_share.py`` builds this on a model). Read a positive head term as "its
share of the block's growth", not as "the head expands the stream"; ablate to learn what
removing it does. With frozen norms (below) the same holds with each norm's scale held too.

Other block layouts (:mod:`thermo_lens.core.layout`, ``thermo_lens.definitions`` §7) are exact the
same way once every norm's per-token scale is frozen at its value in the pass (one scalar per
token, so the norm is a linear map of its input, plus its bias):

* **multiplier** (Granite): every component is scaled by the model's ``alpha`` before it is added;
* **sandwich** (Gemma-2/3, OLMo-2): the attention output passes through ``N_a``, the MLP output
  through ``N_m`` before the add; head ``h`` adds ``r_a g_a * (z_h W_O^h)``, exactly;
* **post-LN** (BERT, MiniLM, OPT-350m): ``x_out = L_2(L_1(x_in + A) + M)`` is affine in ``x_in``
  and the components; ``norm = <T x_in - x_in, s>`` (``T`` the two frozen norms' linear part) is
  the rescaling of the incoming stream, and the norms' biases join ``bias``;
* **mixture of experts** (Mixtral): the MLP term splits further into one term per expert,
  ``expert[..., e] = <w_e E_e(x), .>`` (router weight times expert output);
* **SAEs** spliced into the stream (SAELens ``add_sae`` at ``hook_resid_*``, ``hook_attn_out``,
  ``hook_mlp_out`` or ``attn.hook_z``): the SAE's change ``sae(x) - x`` is a component (``sae``),
  its error term's share with ``use_error_term`` is ``sae_error``, and the heads, MLP and biases
  are read at the SAE's input;
* **hooks between blocks** (a patch or any replacement at ``blocks.{layer+1}.hook_resid_pre``):
  ``x_out = x_{layer+1}`` is the stream the next block reads, as for the gain, so the change from
  the block's output as written (``hook_resid_post``) is a component (``splice``), exactly as an
  SAE there would be.

In every case each term is ``<c, u_c>`` with ``u_c`` the transpose of the (frozen, linear) map
from where ``c`` is written to ``x_out``, applied to ``s``; ``u_c = s`` for a pre-LN block.

Computed inside the forward pass: per block, the hooks keep ``x_in``, ``z``, the MLP output, the
norms' scales (``hook_scale``) and SAE activations until ``x_out``'s hook fires, reduce them to
the per-token terms and drop them. The head term is ``<z_h, u W_O^{hT}>``, so no
``[batch, pos, head, d_model]`` tensor is formed. User hooks run before the reductions, so an
ablated or patched run is attributed as it ran.

Each block's attribution is checked to close (``closure``, the part of ``total`` the components
do not explain, must be at float32 rounding level), so anything the layout does not describe (a
user hook that edits an activation between the components and the stream, an SAE inside a norm)
fails loudly, naming the hook or SAE, instead of giving wrong numbers.

Weight processing (TransformerLens' ``from_pretrained``, ``load_and_process_state_dict``, the
bridge's compatibility mode) changes some terms; every result records the steps the weights show
(``weight_processing``, :attr:`thermo_lens.ModelView.weight_processing`), and with ``P = I - 1 1^T /
d_model`` the projection that removes the mean over ``d_model`` (pre-LN blocks):

* ``fold_ln``: each LayerNorm's weight and bias move into the weights that read it (``W_Q``,
  ``W_K``, ``W_V``, ``W_in`` and their biases; ``b_V^h`` gains ``b_ln W_V^h``). ``z_h``,
  ``mlp_out`` and the residual stream are the same tensors, so every term is unchanged.
* ``center_writing_weights``: ``W_O``, ``W_out``, ``W_E``, ``W_pos``, ``b_O`` and ``b_out`` lose
  their mean over ``d_model``, so every write and the stream itself become ``P c`` and ``P x`` (the
  norms read after them are unchanged). Each term becomes ``<c, P s>``: its share of the change of
  ``||P x||^2``, the centred stream's squared norm; ``total`` (and the gains) are the centred
  stream's, not the raw model's.
* ``center_unembed``: only ``W_U``; no term changes.
* ``fold_value_biases``: each head's value bias moves into the output bias, ``b_O' = b_O + sum_h
  b_V^h W_O^h`` and ``b_V = 0``; attention rows sum to 1, so ``z_h' = z_h - b_V^h`` and
  ``head' = head - <b_V^h W_O^h, s>``, ``bias' = bias + sum_h <b_V^h W_O^h, s>``; ``mlp``,
  ``total`` and the stream are unchanged. After ``fold_ln``, ``b_V^h`` includes the LayerNorm
  bias's share ``b_ln W_V^h``, which moves too. (``load_and_process_state_dict`` folds value biases
  by default, even with ``fold_ln=False``: head terms of such a model differ from the raw model's
  by ``<b_V^h W_O^h, s>``, and the bias term carries them.)

With every step (``from_pretrained``'s default), ``head = <(z_h - b_V^h - b_ln W_V^h) W_O^h, P s>``
with ``z_h``, ``b_V``, ``b_ln`` and ``s`` the raw model's (tested against a raw model's
``run_with_cache`` in ``tests/hosts/test_hosts_tl_habits.py``).
"""

from thermo_lens.measures.attribution.terms import (ATTRIBUTION_DEFINITIONS, ATTRIBUTION_SCOPES, attribution_terms,
                                           sae_sites)
from thermo_lens.measures.attribution.result import GainAttribution, attribution_from_collected, gain_attribution

__all__ = ["GainAttribution", "gain_attribution", "attribution_terms", "attribution_from_collected",
           "ATTRIBUTION_SCOPES", "ATTRIBUTION_DEFINITIONS", "sae_sites"]
