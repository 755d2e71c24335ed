"""Interactive views: Plotly figures and offline circuitsvis panels for every thermo-lens result.

Every function returns a ``plotly.graph_objects.Figure`` you can restyle (``fig.update_layout``),
whose hover text names the exact definition behind each number (token scope, BOS mode, float32
norms, model dtype, raw/processed weights, pre/post-LN). Inputs are the result objects
(``GainResult``, ``SpectralSignature``, ``SheafTraces``, ...), lists or ``{name: result}`` dicts of
them for overlays, or ``ThermoProfile``s (the matching field is used).

=========================  ====================================================================
``layer_dynamics``         block gain per layer (0-based block index), 95% CI bands (GainResult)
``anisotropy_plot``        mean pairwise cosine per residual state (AnisotropyResult)
``robustness_plot``        gain by prompt category (RobustnessResult)
``head_heatmap``           any ``[layer, head]`` tensor with a title and its definition
``spectral_scatter``       ||W_V||_2 vs ||W_O||_2, log-log, colour per model, symbol per lab
``spectral_heatmaps``      per-head spectral metrics of one model
``sheaf_trace_heatmap``    mean sheaf Laplacian trace per head (SheafTraces)
``attribution_heatmap``    each head's exact share of its block's squared-norm change (GainAttribution)
``sheaf_plot``             one head's Laplacian: M, spectrum, restriction-map norms (SheafLaplacian)
``l_star_plot``            layer trace with empirical and predicted L* (LStarResult)
``kleiber_plot``           gain vs L with the bound 10^(1/L) (per-model table)
``heritage_plot``          per-lab mean gain +- SE with Fisher tests
``hierarchy_plot``         groups ranked by mean gain with CIs
``reference_overlay``      your models among the paper's published ones, like-for-like stated

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures"; :mod:`thermo_lens.definitions`.
=======
``attention_panel``        circuitsvis attention patterns next to per-head metrics (offline HTML;
                           ``head=`` selects heads)
``sae_gain_change_plot``   gain with / without attached SAEs and the paired change (SAEGainChange)
``feature_chart``          per SAE, the features that amplify / damp their block most, with CIs
                           (``GainAttribution.plot_features()``, ``sae_features=True``)
``feature_panel``          one SAE feature: its term per prompt, its latent per token (circuitsvis),
                           decoder norm, cosine with the block's heads' output spaces
``sweep_heatmap``          a patching / ablation sweep's [layer, head] effect, non-significant cells
                           marked, CI and Holm p in the hover (SweepResult)
``paired_difference_plot`` a PairedDifference per layer with paired t-CIs (PairedDifference)
=========================  ====================================================================

Per-head figures take ``layers=`` / ``heads=`` subsets (negative indices from the end); ``layer``
is always the 0-based block index of ``blocks.{layer}``.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures"; :mod:`thermo_lens.definitions`.
"""

from thermo_lens.views._common import POST_LN_NOTE, ThermoLensViewError
from thermo_lens.views.dynamics import anisotropy_plot, layer_dynamics, robustness_plot
from thermo_lens.views.heads import (
    attribution_heatmap,
    head_heatmap,
    sheaf_trace_heatmap,
    spectral_heatmaps,
    spectral_scatter,
)
from thermo_lens.views.laws import (
    gain_row,
    heritage_plot,
    hierarchy_plot,
    kleiber_plot,
    reference_overlay,
    rows_frame,
)
from thermo_lens.views.metrics import metric_plot
from thermo_lens.views.panels import (
    AttentionPanel,
    attention_panel,
    circuitsvis_html,
    panel_from_results,
)
from thermo_lens.views.sheaf import l_star_plot, restriction_norms, sheaf_plot
from thermo_lens.views.sae import sae_gain_change_plot
from thermo_lens.views.sae_features import FeaturePanel, feature_chart, feature_panel
from thermo_lens.views.sweeps import paired_difference_plot, sweep_heatmap

__all__ = [
    "sae_gain_change_plot",
    "feature_chart",
    "feature_panel",
    "FeaturePanel",
    "POST_LN_NOTE",
    "ThermoLensViewError",
    "layer_dynamics",
    "anisotropy_plot",
    "robustness_plot",
    "head_heatmap",
    "spectral_scatter",
    "spectral_heatmaps",
    "sheaf_trace_heatmap",
    "sheaf_plot",
    "restriction_norms",
    "l_star_plot",
    "kleiber_plot",
    "heritage_plot",
    "hierarchy_plot",
    "reference_overlay",
    "gain_row",
    "rows_frame",
    "attention_panel",
    "AttentionPanel",
    "panel_from_results",
    "attribution_heatmap",
    "circuitsvis_html",
    "metric_plot",
    "sweep_heatmap",
    "paired_difference_plot",
]
