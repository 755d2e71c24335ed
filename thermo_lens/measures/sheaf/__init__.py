"""Sheaf restriction maps, the factored sheaf Laplacian, and its trace per head.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective", section 5 and appendix D; ``thermo_lens.definitions`` §3 (where the two disagree, the
definitions page says what thermo-lens computes and why).

One attention head ``h`` of layer ``l`` on one prompt of ``n`` tokens, with pattern
``A`` (``n x n``, ``A[i, j]`` = attention of query ``i`` to key ``j``, rows sum to 1) and value
weights ``W_V`` (``[d_model, d_head]``, TransformerLens convention ``v = x @ W_V``), defines a
cellular sheaf on the complete graph of the tokens:

* node stalks ``R^{d_model}`` (one per token), edge stalks ``R^{d_head}`` (one per unordered pair
  ``{i, j}``, ``i != j``; no self-loops);
* restriction map from token ``i`` to edge ``{i, j}``: ``rho_ij = sqrt(c_ij) W_V``, i.e.
  ``x_i -> sqrt(c_ij) x_i @ W_V`` (``F_i = sqrt(c_ij) W_V^T`` acting on column vectors), where
  the edge coefficients ``c`` depend on the named *convention*:

  ``"directed"`` (the paper's reading, default)
      ``c_ij = A_ij``: each end of an edge is weighted by its own attention to the other end.
  ``"symmetrized"``
      ``c_ij = c_ji = w_ij = (A_ij + A_ji) / 2`` on both ends of the edge.

* coboundary ``(delta x)_{ij} = rho_ji^T x_j - rho_ij^T x_i`` for ``i < j`` and the Laplacian
  ``L = delta^T delta`` (size ``n d_model``).

Because every map is a scalar times the same ``W_V``, ``L`` factors exactly (Kronecker product,
token-major ordering ``vec(X)`` of ``X [n, d_model]``)::

    L = M (x) S,   S = W_V W_V^T  [d_model, d_model],
    M_ii = sum_{j != i} c_ij,   M_ij = -sqrt(c_ij c_ji)   (i != j).

``directed``: ``M_ii = 1 - A_ii`` for row-stochastic ``A`` and ``M_ij = -sqrt(A_ij A_ji)``;
causal attention has ``A_ij A_ji = 0`` for ``i != j``, so ``M = diag(1 - A_ii)``: the Laplacian
is block-diagonal over tokens, couples no two tokens, and its spectrum is
``{(1 - A_ii) sigma_k(W_V)^2}`` plus zeros. ``symmetrized``: ``M = L_graph(w)``, the weighted
graph Laplacian of the attention graph, with a meaningful graph spectral gap. Both conventions
have the same trace::

    Tr L = Tr M * ||W_V||_F^2 = (sum_{i != j} A_ij) ||W_V||_F^2 = (n - sum_i A_ii) ||W_V||_F^2.

The paper's printed formula (its eq. 4) ``(sum_ij A_ij - n) ||W_V||_F^2`` is identically 0 for
softmax attention; its notebooks computed the off-diagonal-mass version above. Both are offered
by name in :func:`sheaf_traces`.

Why the spectral gap ``lambda_2(L)`` is 0, and what fixes the spectrum. For any head with
``d_head < d_model`` the gap is 0 *whatever the attention mask* (causal or not): ``W_V^T`` has a
kernel of dimension ``d_model - rank(W_V) >= 1`` in every token's stalk, so ``dim ker L >= n (d_model
- d_head) >= 2`` as soon as ``n >= 2``. Causal attention only adds more zeros (token 0 has
``A_00 = 1``). And the spectrum itself is set by a modelling choice: weighting token ``i``'s end of
edge ``{i, j}`` by its own row ``A_ij`` ("directed", ``M_ii = sum_{j != i} A_ij``, the row sums) is
one reading; weighting it by the column, ``A_ji`` (how much ``j`` attends to ``i``), gives
``M_ii = sum_{j != i} A_ji``, the same trace (both sum all off-diagonal attention) and a different
spectrum. thermo-lens uses the row-sum reading (the paper's); ``spectral_gap().reason`` says so.

Multi-head (the paper's Proposition 1): the direct sum of the per-head sheaves has the
block-diagonal Laplacian ``diag(L^(1), ..., L^(H))``; traces add and the spectrum is the union
(:class:`LayerSheafLaplacian`). Note that this is a *construction*: if instead all heads share the
token stalks ``R^{d_model}`` and the edge stalk is the concatenation ``R^{H d_head}``, the
Laplacian is the *sum* ``sum_h M_h (x) W_V^h W_V^h^T`` (traces still add, the spectrum is not the
union): ``LayerSheafLaplacian.dense(structure="shared_stalks")``.

Cost: the trace needs only ``diag(A)`` and ``||W_V^h||_F^2`` (O(n) per head), so
:func:`sheaf_traces` reduces each pattern to its diagonal inside the forward hook
(:func:`thermo_lens.measures.sheaf.traces.attention_diagonal`); the ``n x n`` pattern is kept only for the one
layer of :func:`sheaf_laplacian`.
"""

from thermo_lens.measures.sheaf.entry import (
    attention_pattern,
    laplacian_from_collected,
    sheaf_laplacian,
)
from thermo_lens.measures.sheaf.gap import SpectralGap
from thermo_lens.measures.sheaf.operator import LayerSheafLaplacian, SheafLaplacian
from thermo_lens.measures.sheaf.restriction import RestrictionMaps
from thermo_lens.measures.sheaf.traces import (
    TRACE_DEFINITIONS,
    SheafTraces,
    sheaf_traces,
    traces_from_collected,
)
from thermo_lens.measures.sheaf.validation import (
    CONVENTIONS,
    DENSE_LIMIT,
    TRACE_FORMULAS,
    Convention,
    TraceFormula,
)

__all__ = [
    "CONVENTIONS",
    "TRACE_FORMULAS",
    "TRACE_DEFINITIONS",
    "Convention",
    "TraceFormula",
    "DENSE_LIMIT",
    "SheafLaplacian",
    "LayerSheafLaplacian",
    "RestrictionMaps",
    "SpectralGap",
    "SheafTraces",
    "sheaf_laplacian",
    "laplacian_from_collected",
    "attention_pattern",
    "sheaf_traces",
    "traces_from_collected",
]
