"""The paper's own gain metrics, by name, measured on the prompts the paper used for them.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", used several gain
definitions (its "metric A" = NO_FINAL_LN penultimate-block gain, "metric B" = the last block from
forward hooks, ...). :data:`PAPER_METRICS` maps each onto thermo-lens's named definitions and
:func:`paper_metric` measures it on a model. By default it uses the prompt set the paper used for
that metric in that experiment (:data:`PAPER_EXPERIMENTS`), and the result says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thermo_lens._lazy import pandas as pd

from thermo_lens.measures.gain import GainResult, residual_gain
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.inputs import Prompts
from thermo_lens.core.result import Result
from thermo_lens.stats import SummaryStats

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel
    from thermo_lens.core.model import ModelView

__all__ = ["PAPER_METRICS", "PAPER_EXPERIMENTS", "DEFAULT_EXPERIMENT", "PaperMetric",
           "PaperMetricResult", "paper_metric"]

#: (metric, experiment) -> the built-in prompt set the paper's result file for it used.
PAPER_EXPERIMENTS: dict[tuple[str, str], str] = {
    ("A", "pythia_family"): "pythia25",           # pythia_family_NO_FINAL_LN: Kleiber r, Fig. 1
    ("A", "lab_survey"): "high_rho_hunt_5",       # high_rho_hunt_NO_FINAL_LN: heritage, crowding
    ("A", "clean_residual"): "clean_residual_3",  # clean_residual_NO_FINAL_LN
    ("B", "benchmark"): "paper25",                # thermodynamic_benchmark: the abstract's hierarchy
    ("B", "twins"): "paper25",                    # twin_test_results
    ("alltokens", "input_dependency"): "input_dependency_5",
    ("emb_to_block0", "pythia_family"): "pythia25",
}

#: The experiment each metric defaults to (the one behind the paper's headline use of it).
DEFAULT_EXPERIMENT: dict[str, str] = {"A": "pythia_family", "B": "benchmark",
                                      "alltokens": "input_dependency", "emb_to_block0": "pythia_family"}

@dataclass(frozen=True)
class PaperMetric(Result):
    """One of the paper's gain definitions, mapped onto thermo-lens' named definitions.

    Attributes:
        name: short name (``"A"``, ``"B"``, ...).
        reference_measurement: the ``measurement`` column of ``data/paper_reference_table.csv``.
        summary: the :data:`SUMMARIES` entry it equals.
        token_scope: the token scope it uses.
        prepend_bos: the BOS mode the paper's HF tokenizers used (``"tokenizer"``).
        paper_definition: what the paper's code computed.
        note: how thermo-lens' value can differ from the paper's.
    """

    name: str
    reference_measurement: str
    summary: str
    token_scope: str
    prepend_bos: bool | str
    paper_definition: str
    note: str = ""


_FP_NOTE = ("thermo-lens takes norms in float32 (the paper took some in fp16/bf16) and reports the "
            "SD with ddof=1 (the paper's files store ddof=0: see .value.sd_ddof0)")

#: The paper's gain definitions by name (thermo_lens/data/paper_reference_table.csv holds its numbers).
PAPER_METRICS: dict[str, PaperMetric] = {
    "A": PaperMetric(
        "A", "residual_gain_no_final_ln", "penultimate_gain", "last", "tokenizer",
        "mean over prompts of ||h[-2]|| / ||h[-3]|| of HF output_hidden_states at the last token: "
        "h[L-1] and h[L-2] are block inputs, so this is G_{L-1}, the penultimate block "
        "(the paper's NO_FINAL_LN fix, Fig. 1-2, Kleiber r)",
        "equals G_{L-1} exactly; the paper dropped the last block to avoid HF's final-normed "
        "h[-1]; thermo-lens reads x_L from the hooks and also offers G_L (metric B). " + _FP_NOTE,
    ),
    "B": PaperMetric(
        "B", "last_block_gain_hook", "last_block_gain", "last", "tokenizer",
        "forward hook on every decoder block; mean over prompts of ||out_L[-1]|| / ||out_{L-1}[-1]|| "
        "(true last block, before the final norm; the abstract's 0.80 / 1.11 / 1.48 / 2.31)",
        _FP_NOTE,
    ),
    "alltokens": PaperMetric(
        "alltokens", "last_block_gain_alltokens", "last_block_gain", "frobenius", "tokenizer",
        "||out_L||_F / ||out_{L-1}||_F over all tokens of [1, seq, d_model]",
        _FP_NOTE,
    ),
    "emb_to_block0": PaperMetric(
        "emb_to_block0", "emb_to_block0_gain", "first_block_gain", "last", "tokenizer",
        "mean over prompts of ||h[1]|| / ||h[0]|| at the last token (embedding -> block 0 output)",
        _FP_NOTE,
    ),
}


@dataclass(frozen=True, repr=False, eq=False)
class PaperMetricResult(Result):
    """A paper metric measured on a model: the spec, its across-prompt value, the full gain."""

    metric: PaperMetric
    value: SummaryStats
    gain: GainResult
    prompt_set: str = ""
    experiment: str = ""

    def __repr__(self) -> str:
        m, v = self.metric, self.value
        return (f"PaperMetricResult(metric {m.name} = {m.reference_measurement} = {m.summary} "
                f"[token_scope={m.token_scope!r}, prepend_bos={m.prepend_bos!r}] on "
                f"{self.gain.model.get('name')}: {v.format()}; paper-style SD (ddof=0) "
                f"{v.sd_ddof0:.4g})\n  prompts: {self.prompt_set or 'custom'}"
                f"{f' (the set the paper used for metric {m.name} in its {self.experiment} experiment)' if self.experiment else ''}"
                f"\n  paper: {m.paper_definition}\n  note: {m.note}")

    def to_frame(self) -> pd.DataFrame:
        """One row: the metric, its reference measurement name and the summary (mean, sd, ...)."""
        row = {"metric": self.metric.name, "reference_measurement": self.metric.reference_measurement,
               "prompt_set": self.prompt_set, "experiment": self.experiment,
               "summary": self.metric.summary, **self.value.to_dict(), "sd_ddof0": self.value.sd_ddof0,
               **self.gain._common()}
        return pd.DataFrame([row])


def paper_metric(
    model: TransformerLensModel | ModelView,
    prompts: Prompts | None = None,
    metric: str = "A",
    *,
    experiment: str | None = None,
    **kwargs: Any,
) -> PaperMetricResult:
    """Measure one of the paper's gain metrics (:data:`PAPER_METRICS`) exactly as it defined it.

    Args:
        model: a TransformerLens model.
        prompts: a list of prompts, a :class:`~thermo_lens.core.prompts.PromptSet` or a built-in set
            name. Default ``None``: the set the paper used for ``metric`` in ``experiment``
            (:data:`PAPER_EXPERIMENTS`): metric A -> ``"pythia25"`` (Pythia sweep, Kleiber) or
            ``"high_rho_hunt_5"`` (lab survey), metric B -> ``"paper25"`` (the benchmark set).
        metric: ``"A"`` (penultimate, NO_FINAL_LN), ``"B"`` (last block, the abstract's values),
            ``"alltokens"`` (Frobenius) or ``"emb_to_block0"``.
        experiment: which of the paper's experiments to reproduce (default
            :data:`DEFAULT_EXPERIMENT` of the metric); only picks the default prompts.
        **kwargs: passed to :func:`~thermo_lens.measures.gain.residual_gain` (``batch_size``,
            ``truncate``, ``fwd_hooks``, ``progress``...); ``token_scope``/``prepend_bos``
            default to the paper's.

    The result records ``prompt_set`` and ``experiment`` and its ``repr`` says which set was used.
    """
    if metric not in PAPER_METRICS:
        raise ThermoLensInputError(
            f"unknown paper metric {metric!r}; choose one of {', '.join(map(repr, PAPER_METRICS))}"
        )
    spec = PAPER_METRICS[metric]
    exp = experiment or DEFAULT_EXPERIMENT[metric]
    if (metric, exp) not in PAPER_EXPERIMENTS:
        known = sorted(e for m, e in PAPER_EXPERIMENTS if m == metric)
        raise ThermoLensInputError(f"the paper has no metric {metric!r} experiment {exp!r}; known: {known}")
    from thermo_lens.core.prompts import PromptSet, as_prompt_set

    if prompts is None:
        ps = as_prompt_set(PAPER_EXPERIMENTS[(metric, exp)])
        name, used_exp, prompts = ps.name, exp, ps.prompts
    elif isinstance(prompts, str):
        ps = as_prompt_set(prompts)
        name, prompts = ps.name, ps.prompts
        used_exp = exp if name == as_prompt_set(PAPER_EXPERIMENTS[(metric, exp)]).name else ""
    else:
        name = prompts.name if isinstance(prompts, PromptSet) else "custom"
        used_exp = ""
    kwargs.setdefault("token_scope", spec.token_scope)
    kwargs.setdefault("prepend_bos", spec.prepend_bos)
    g = residual_gain(model, prompts, **kwargs)
    return PaperMetricResult(metric=spec, value=g.summaries[spec.summary], gain=g,
                             prompt_set=str(name), experiment=used_exp)
