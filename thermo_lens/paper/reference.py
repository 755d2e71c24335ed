"""The paper's published per-model numbers, for overlays ("where does my model sit?").

Source: D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective", and the result files released with it. ``thermo_lens/data/paper_reference_table.csv``
holds one row per model x measurement with the definition the paper's code actually used and the
result file it came from (``source_file``). The list below says how these definitions relate to
thermo-lens's own (``penultimate_gain``, ``last_block_gain``, ...; ``thermo_lens.measures.gain.SUMMARIES``).

The CSV's columns: ``model, hf_id, lab, n_layers, n_heads, d_model, d_head, rho, measurement,
value, std, n_prompts, dtype, token_scope, definition, label, source_file, notes``;
``rho = n_heads / d_head`` (query heads; Falcon-7B has 71 query heads and 1 KV head).

Gain measurements (``measurement`` column)
------------------------------------------
``residual_gain_no_final_ln``  (paper "NO_FINAL_LN", "metric A")
    Mean over prompts of ``||h[-2]|| / ||h[-3]||`` with ``h`` = HuggingFace
    ``output_hidden_states``, last token only, model in float16 (norms in fp16). Because HF replaces
    the last hidden state by the final-normed one, ``h[-2]`` is the output of block L-1: this is the
    gain of the **penultimate** block, G_{L-1} (thermo-lens ``penultimate_gain``), not the last
    block's. ``std`` is ``np.std`` with ddof=0 (stated for the Pythia sweep). Used for the paper's
    Fig. 1 (Kleiber, r = -0.81), Fig. 2 (heritage) and the crowding hypothesis (H25).
``residual_gain_with_final_ln``
    ``||h[-1]|| / ||h[-2]|| = ||ln_f(x_L)|| / ||x_{L-1}||``: the last block *including the final
    norm* (the "final LayerNorm artifact"); for OPT-350m ``h[-1]`` is after ``project_out``.
``emb_to_block0_gain``
    ``||h[1]|| / ||h[0]||``: embedding -> output of block 1.
``last_block_gain_hook``  (paper "metric B", Grand Unified benchmark, twin test)
    Forward hooks on every decoder block, mean over 25 prompts of ``||out_L|| / ||out_{L-1}||`` at
    the last token: the true last block, before the final norm (thermo-lens ``last_block_gain``).
    Norms taken in the model dtype (fp16 or bf16). The abstract's 0.80 / 1.11 / 1.48 / 2.31.
``last_block_gain_alltokens``
    ``||out_L||_F / ||out_{L-1}||_F`` over all tokens of one prompt (thermo-lens ``frobenius``
    scope), bf16 with autocast.

Other measurements (traces, spectral norms, L*, MLP gains, ...) are in :func:`table`; their
``definition`` column says exactly what was computed and ``notes`` flags the invalid ones (e.g. the
4-bit NF4 rows, the mis-split Pythia W_V).

Paper labels (``label`` column): ``EXPAND`` / ``DAMPEN`` are the sign of the mean gain minus one
(G > 1 / G < 1, no uncertainty), as the paper's code assigned them; lab aggregates use
``EXPANDER`` / ``DAMPENER`` / ``NEUTRAL``. thermo-lens's own regimes come from a confidence interval
(``thermo_lens.laws.regime_from_gain``).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np
from thermo_lens._lazy import pandas as pd

__all__ = [
    "GAIN_MEASUREMENTS",
    "SOURCES",
    "table",
    "measurements",
    "models",
    "gains",
    "pythia_family",
    "lab_survey",
    "benchmark",
    "twins",
    "paper_statistics",
]

_DATA_FILE = "paper_reference_table.csv"

#: Measurement names that are a per-model residual gain (one value per model and source file).
GAIN_MEASUREMENTS: tuple[str, ...] = (
    "residual_gain_no_final_ln",
    "residual_gain_with_final_ln",
    "emb_to_block0_gain",
    "last_block_gain_hook",
    "last_block_gain_alltokens",
)

#: Result files behind the main experiments (the ``source_file`` column).
SOURCES: dict[str, str] = {
    "pythia_family": "pythia_family_NO_FINAL_LN_20260105_174820.json",
    "lab_survey": "high_rho_hunt_NO_FINAL_LN_20260105_184728.json",
    "clean_residual": "clean_residual_NO_FINAL_LN_20260105_173546.json",
    "benchmark": "thermodynamic_benchmark_20260105_141034.json",
    "twins": "twin_test_results_20260105_160237.json",
    "gpt2_layernorm": "gpt2_layernorm_validation_20260105_150306.json",
    "gptj_parallel": "gptj_parallel_test_20260105_152333.json",
}

_INT_COLS = ("n_layers", "n_heads", "d_model", "d_head", "n_prompts")
_STR_COLS = ("model", "hf_id", "lab", "measurement", "dtype", "token_scope", "definition",
             "label", "source_file", "notes")
_ARCH_COLS = ("n_layers", "n_heads", "d_model", "d_head", "rho")
_GAIN_COLS = ["model", "hf_id", "lab", "n_layers", "n_heads", "d_model", "d_head", "rho", "gain",
              "std", "n_prompts", "definition", "label"]
_EXTRA_COLS = ["std_ddof", "dtype", "token_scope", "measurement", "source_file", "notes"]


@lru_cache(maxsize=1)
def _load() -> pd.DataFrame:
    with resources.files("thermo_lens").joinpath("data", _DATA_FILE).open("r", encoding="utf-8") as f:
        df = pd.read_csv(f, dtype={c: "string" for c in _STR_COLS})
    for c in _INT_COLS:
        col = pd.to_numeric(df[c], errors="raise")
        if not np.all(np.isnan(col) | (col == np.round(col))):
            raise ValueError(f"reference table: column {c!r} has non-integer values")
        df[c] = col.astype("Int64")
    for c in ("rho", "value", "std"):
        df[c] = pd.to_numeric(df[c], errors="raise").astype("float64")
    return df


def _key(hf_id: pd.Series) -> pd.Series:
    """Canonical checkpoint key: lower-case HF id, ``openai-community/`` prefix dropped."""
    return hf_id.str.lower().str.replace(r"^openai-community/", "", regex=True)


def table() -> pd.DataFrame:
    """The whole reference CSV, as shipped, typed (a fresh copy).

    Integer columns (``n_layers, n_heads, d_model, d_head, n_prompts``) are nullable ``Int64``;
    ``rho, value, std`` float64; text columns pandas ``string`` (missing = ``<NA>``). Rows whose
    ``hf_id`` is missing are aggregates (e.g. ``pythia family (8)``: the paper's own Pearson r).
    """
    return _load().copy()


def measurements() -> pd.DataFrame:
    """Distinct ``measurement`` names with their row count, source files and first definition."""
    df = _load()
    g = df.groupby("measurement", sort=False)
    return pd.DataFrame({
        "measurement": list(g.groups),
        "n_rows": g.size().to_numpy(),
        "definition": g["definition"].first().to_numpy(),
        "source_files": g["source_file"].agg(lambda s: "; ".join(dict.fromkeys(s.dropna()))).to_numpy(),
    })


def models() -> pd.DataFrame:
    """One row per distinct checkpoint in the table (aggregate rows excluded).

    Columns ``model, hf_id, lab, n_layers, n_heads, d_model, d_head, rho, measurements``.
    Checkpoints are matched case-insensitively on ``hf_id`` (``gpt2`` == ``openai-community/gpt2``);
    ``model``/``lab`` are the first spelling in the file (the file spells a checkpoint several ways:
    ``gpt-j-6B``/``GPT-J-6B``, lab ``Mistral``/``Mistral AI``) and architecture columns the first
    non-missing value over all of that checkpoint's rows (where given, they never disagree).
    """
    df = _load()
    df = df[df["hf_id"].notna()].copy()
    df["_key"] = _key(df["hf_id"])
    g = df.groupby("_key", sort=False)
    out = g[["model", "hf_id", "lab", *_ARCH_COLS]].first()
    out["measurements"] = g["measurement"].agg(lambda s: len(set(s)))
    return out.reset_index(drop=True)


def _fill_arch(rows: pd.DataFrame) -> pd.DataFrame:
    arch = models()
    arch["_key"] = _key(arch["hf_id"])
    arch = arch.set_index("_key")
    keys = _key(rows["hf_id"])
    for c in _ARCH_COLS:
        fill = keys.map(arch[c])
        rows[c] = rows[c].fillna(fill.astype(rows[c].dtype))
    need = rows["rho"].isna() & rows["n_heads"].notna() & rows["d_head"].notna()
    rows.loc[need, "rho"] = rows.loc[need, "n_heads"].astype(float) / rows.loc[need, "d_head"].astype(float)
    return rows


def gains(measurement: str = "residual_gain_no_final_ln", source: str | None = None,
          unique: bool = True, fill_architecture: bool = True) -> pd.DataFrame:
    """Per-model gains from the paper, one row per model: a ready input for ``thermo_lens.laws``.

    Parameters
    ----------
    measurement:
        One of :data:`GAIN_MEASUREMENTS` (any measurement name of the table is accepted).
        Default ``"residual_gain_no_final_ln"``: the paper's "NO_FINAL_LN" number = the
        **penultimate** block's gain ``||h[-2]|| / ||h[-3]||`` from HF hidden states, last token,
        float16, mean over prompts, ``std`` with ddof=0 (see the module docstring).
    source:
        Restrict to one result file: a key of :data:`SOURCES` (``"pythia_family"``,
        ``"lab_survey"``, ...) or a ``source_file`` name.
    unique:
        Several files measured the same checkpoint (Pythia-6.9B is in three). When True keep one
        row per checkpoint: the one with the most prompts, ties broken by file order.
    fill_architecture:
        Fill missing ``n_layers, n_heads, d_model, d_head, rho`` from other rows of the same
        checkpoint in the table (e.g. ``last_block_gain_hook`` rows carry no geometry).

    Returns
    -------
    DataFrame with columns ``model, hf_id, lab, n_layers, n_heads, d_model, d_head, rho, gain, std,
    n_prompts, definition, label`` then ``std_ddof`` (0 for rows of a file that states ddof=0,
    else unknown), ``dtype, token_scope, measurement, source_file, notes``.
    """
    df = _load()
    if measurement not in set(df["measurement"]):
        raise ValueError(f"unknown measurement {measurement!r}; gain measurements: "
                         f"{', '.join(GAIN_MEASUREMENTS)}")
    rows = df[(df["measurement"] == measurement) & df["hf_id"].notna()]
    if source is not None:
        file = SOURCES.get(source, source)
        if file not in set(df["source_file"].dropna()):
            raise ValueError(f"unknown source {source!r}; known: {', '.join(SOURCES)} or a source_file")
        rows = rows[rows["source_file"] == file]
        if rows.empty:
            raise ValueError(f"source {source!r} has no {measurement!r} rows")
    rows = rows.copy()
    if unique:
        rows["_key"] = _key(rows["hf_id"])
        rows["_order"] = np.arange(len(rows))
        rows["_np"] = rows["n_prompts"].fillna(0).astype("int64")
        rows = (rows.sort_values(["_np", "_order"], ascending=[False, True])
                .drop_duplicates("_key").sort_values("_order")
                .drop(columns=["_key", "_order", "_np"]))
    if fill_architecture:
        rows = _fill_arch(rows)
    rows = rows.rename(columns={"value": "gain"})
    # A file that states ddof=0 for one of its gains used np.std (ddof=0) for all of them.
    notes = df["notes"].fillna("")
    ddof0_files = set(df.loc[notes.str.contains("ddof=0", regex=False), "source_file"].dropna())
    rows["std_ddof"] = pd.array([0 if f in ddof0_files else pd.NA for f in rows["source_file"]],
                                dtype="Int64")
    return rows[_GAIN_COLS + _EXTRA_COLS].reset_index(drop=True)


def pythia_family(measurement: str = "residual_gain_no_final_ln") -> pd.DataFrame:
    """The 8 Pythia models of the paper's Kleiber correlation (Fig. 1; D'Elia 2026, section 4.1).

    Rows of ``pythia_family_NO_FINAL_LN_20260105_174820.json``: pythia-70m, -160m, -410m, -1b,
    -1.4b, -2.8b, -6.9b, -12b; 25 prompts (``prompts.get("pythia25")``), float16, last token,
    ``std`` ddof=0. With the default measurement,
    ``pearsonr(rho, gain) = (-0.8116, p = 0.0144)`` (the paper's "r = -0.81, p = 0.014", which
    the paper's text attributes to gain vs depth) and ``pearsonr(n_layers, gain) = -0.878``.
    """
    out = gains(measurement, source="pythia_family", unique=False)
    if len(out) != 8:  # pragma: no cover - guards the shipped data
        raise RuntimeError(f"expected 8 Pythia rows, found {len(out)}")
    return out


def lab_survey(measurement: str = "residual_gain_no_final_ln") -> pd.DataFrame:
    """The 16-model, 5-lab "high rho hunt" (5 prompts, ``prompts.get("high_rho_hunt_5")``).

    The data behind the paper's heritage claim ("EleutherAI 80% dampening", D'Elia 2026 section 4.2)
    and the crowding hypothesis H25 (``rho >= 0.2 <=> G < 1``; its own file stores accuracy 0.4375).
    Labs: EleutherAI 5, Meta 5 (OPT), BigScience 4 (BLOOM), StabilityAI 1, TII 1. No OpenAI,
    Google or Mistral model is in it.
    """
    return gains(measurement, source="lab_survey", unique=False)


def benchmark() -> pd.DataFrame:
    """The Grand Unified benchmark: 4 models, ``last_block_gain_hook``, 25 prompts, fp16.

    The abstract's hierarchy Pythia-6.9B (0.80) < Mistral-7B (1.11) < LLaMA-3.1-8B (1.48) <
    Gemma-7B (2.31) (D'Elia 2026, abstract and section 5.1).
    """
    return gains("last_block_gain_hook", source="benchmark", unique=False)


def twins() -> pd.DataFrame:
    """Base vs instruction-tuned pairs of the paper's twin test (D'Elia 2026, section 5.5).

    ``last_block_gain_hook``, 25 prompts, bfloat16. Columns as :func:`gains` plus ``base``: the
    ``model`` name of the base checkpoint for a fine-tuned row, missing for a base row (the input
    shape ``thermo_lens.laws.twin`` expects). Caveat carried from the paper's data: the Mistral
    "instruct" model is ``Mistral-7B-Instruct-v0.2``, whose base is not ``Mistral-7B-v0.1``.
    """
    out = gains("last_block_gain_hook", source="twins", unique=False)
    stem = out["model"].str.replace(r"-(base|instruct)$", "", regex=True)
    is_ft = out["model"].str.endswith("-instruct")
    base = (stem + "-base").where(is_ft.to_numpy(), pd.NA)
    out.insert(1, "base", base.astype("string"))
    return out


def paper_statistics() -> pd.DataFrame:
    """The table's aggregate rows (no ``hf_id``): the paper's own cross-model numbers.

    E.g. ``pearson_r_rho_vs_gain = -0.81163`` and ``pearson_p_rho_vs_gain = 0.0144381`` over the 8
    Pythia models, lab means (whose ``std`` is the SD over models with ddof=0, not the SE the paper's
    Fig. 2 caption says), ``h25_accuracy = 0.4375``, ``L_star_overall_MAPE_v3``.
    """
    df = _load()
    return df[df["hf_id"].isna()].reset_index(drop=True)
