"""The paper's prompt sets, by experiment.

Every built-in set of :mod:`thermo_lens.core.prompts` is one of the paper's (shipped verbatim in
``thermo_lens/data/paper_prompts.json``). This module says which set went with which of the paper's
experiments, so a reproduction uses the same inputs: :func:`for_experiment`.
"""

from __future__ import annotations

from thermo_lens.core.prompts import PromptSet, aliases, get, names

__all__ = ["EXPERIMENT_PROMPTS", "for_experiment", "get", "names", "aliases", "PromptSet"]

#: The paper's experiment (result file stem) -> the built-in prompt set it used.
EXPERIMENT_PROMPTS: dict[str, str] = {
    "pythia_family": "pythia25",              # pythia_family_NO_FINAL_LN (Kleiber r, Fig. 1)
    "lab_survey": "high_rho_hunt_5",          # high_rho_hunt_NO_FINAL_LN (heritage, crowding)
    "clean_residual": "clean_residual_3",
    "benchmark": "paper25",                   # thermodynamic_benchmark (the abstract's hierarchy)
    "twins": "paper25",                       # twin_test_results
    "gpt2_layernorm": "paper25",
    "gptj_parallel": "paper25",
    "input_dependency": "input_dependency_5",
    "l_star_v3": "l_star_v3_5",               # l_star_sign_change (the v3 L* table)
    "h4": "h4_4",
}


def for_experiment(experiment: str) -> PromptSet:
    """The prompt set the paper used in ``experiment`` (a key of :data:`EXPERIMENT_PROMPTS`)."""
    if experiment not in EXPERIMENT_PROMPTS:
        raise ValueError(f"unknown paper experiment {experiment!r}; known: {', '.join(EXPERIMENT_PROMPTS)}")
    return get(EXPERIMENT_PROMPTS[experiment])
