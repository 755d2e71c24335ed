"""The pass engine: one :class:`~thermo_lens.core.passes.one_pass.Pass` per run, and runners that decide how each batch runs.

Nothing here stores a full activation: every reduction (registered by a measurement, e.g.
:func:`thermo_lens.measures.gain.residual_norms`) turns its tensor into the few numbers a metric needs
inside the hook and drops the rest, so a whole battery costs one forward pass per prompt batch
and memory linear in the number of tokens. :func:`collect` runs the pass and returns a
:class:`Collected`; measurements derive their results from it without running the model again
(``*_from_collected``). :func:`thermo_lens.run` (:mod:`thermo_lens.core.measure`) is the public front:
it picks the reductions of the measurements you name and builds their results from one pass.

The seams (one concept per module):

* :mod:`~thermo_lens.core.passes.recorder`: the :class:`Recorder` the reductions write into; results stay
  on the activations' device until the pass ends, then reach the host in one copy per dtype, and
  finiteness checks are device counts read once.
* :mod:`~thermo_lens.core.passes.one_pass`: the :class:`~thermo_lens.core.passes.one_pass.Pass` (prompts and
  their tokenized batch plan, run settings, the recorder; the one place for batching, BOS handling,
  hook checks, detecting hooks already on the model, and provenance) and the
  :class:`~thermo_lens.core.passes.one_pass.Runner` protocol, with the full forward
  (:class:`~thermo_lens.core.passes.one_pass.Forward`).
* runners: :class:`~thermo_lens.core.passes.cached.Cached` (replay an ``ActivationCache``:
  :func:`collect_cached`), :class:`~thermo_lens.core.passes.from_layer.FromLayer` (start at block ``l``
  from given residuals).
* compositions: :func:`~thermo_lens.core.passes.stacked.run_stacked` (many conditions as stacked copies of
  the prompts: the sweeps, the head ablation), :func:`~thermo_lens.core.passes.capture.capture` (clean
  activations for patching: :func:`thermo_lens.patch_from`, the sweeps' clean runs).
* :mod:`~thermo_lens.core.passes.user_hooks` (the caller's ``fwd_hooks``: batch context, errors),
  :mod:`~thermo_lens.core.passes.collected` (what a pass recorded, its checks), :mod:`~thermo_lens.core.passes.memory`.

User hooks passed as ``fwd_hooks`` run in the same pass *before* the reductions, so a reduction at
the same hook point sees the activation as the user's hook left it (e.g. after an ablation). Their
names are checked against the model's hook points before anything runs; each hook can read the
current batch from ``hook.ctx["batch"]`` (:class:`thermo_lens.core.tokens.BatchInfo`); a hook that
raises, returns something the host cannot use, or never runs gets a
:class:`~thermo_lens.core.errors.ThermoLensHookError` naming the hook, the batch and the fix. Hooks
already on the model (``model.add_hook``, ``with model.hooks(...)``, SAEs, PyTorch module hooks)
run too and are recorded beside the ``fwd_hooks`` (:func:`thermo_lens.core.attached.attached_hooks`).
The batch plan depends on the prompts' lengths and the settings, never on hooks.

No scope object. nnsight's ``with model.trace(prompts) as t:`` earns its place there because the
user writes the intervention and the readout as code on proxies inside the block, and the library
must collect that code before it runs the model. Here nothing is deferred: what to measure is a
list of names (``tl.run(model, prompts, ["gain", "attribution"])``), interventions are ordinary
TransformerLens hooks (``fwd_hooks=``, ``with model.hooks(...)``, :func:`thermo_lens.patch_from`), and
every result is built when the pass ends. A ``with tl.trace(model, prompts) as t:`` block would
have to hold the requests until ``__exit__``, so results could not be read inside the block, an
exception inside it would leave a half-run pass, and it would add a second way to say what
``tl.run`` already says in one call. A :class:`~thermo_lens.core.passes.one_pass.Pass` is that object for
the library's own compositions (sweeps, ablation, patching), where a runner is chosen per pass.
"""

from __future__ import annotations

from thermo_lens.core.passes.cached import collect_cached
from thermo_lens.core.passes.collected import Collected
from thermo_lens.core.passes.one_pass import collect
from thermo_lens.core.passes.recorder import Recorder, Reduction
from thermo_lens.core.passes.user_hooks import wrap_user_hooks

__all__ = ["Recorder", "Collected", "Reduction", "collect", "collect_cached", "wrap_user_hooks"]
