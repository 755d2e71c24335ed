"""Built-in prompt sets (thermo_lens.core.prompts): sizes, categories, aliases, user input, errors."""

import dataclasses

import pytest

from thermo_lens.core import prompts
from thermo_lens.core.prompts import CATEGORIES, PromptSet, as_prompt_set

EXPECTED_SIZES = {
    "pythia_family_sweep_25": 25,
    "grand_unified_twin_gpt2_gptj_25": 25,
    "high_rho_hunt_5": 5,
    "clean_residual_3": 3,
    "h4_4": 4,
    "l_star_v3_5": 5,
    "scaling_law_4": 4,
    "ffn_8": 8,
    "opt_anomaly_2": 2,
    "restriction_maps_1": 1,
    "bentov_1": 1,
    "input_dependency_5": 5,
}


def test_names_and_sizes():
    canonical = prompts.names(include_aliases=False)
    assert canonical == list(EXPECTED_SIZES)
    assert set(prompts.names()) == set(EXPECTED_SIZES) | {"paper25", "pythia25"}
    for name, n in EXPECTED_SIZES.items():
        ps = prompts.get(name)
        assert isinstance(ps, PromptSet)
        assert len(ps) == n == len(ps.prompts) == len(ps.categories) == len(list(ps))
        assert ps.name == name
        assert "paper_prompts.json" in ps.source


def test_paper25_is_5_by_5():
    ps = prompts.get("paper25")
    assert ps.name == "grand_unified_twin_gpt2_gptj_25"
    assert len(ps) == 25
    by = ps.by_category()
    assert tuple(by) == CATEGORIES == ("Factual", "Syntactic", "Cliche", "Novel", "Nonsense")
    assert all(len(v) == 5 for v in by.values())
    assert ps.category_names == CATEGORIES
    assert by["Factual"][0] == "The capital city of France is"
    assert "Actions speak louder than" in by["Cliche"]
    assert prompts.get() is prompts.get(prompts.DEFAULT) is ps


def test_pythia25_categories_recovered_from_blocks():
    ps = prompts.get("pythia25")
    assert ps.name == "pythia_family_sweep_25"
    assert ps.categories == tuple(c for c in CATEGORIES for _ in range(5))
    assert "inferred" in ps.source
    # The evidence the docstring gives: shared prompts (or openings) with the same category of paper25.
    p25 = prompts.get("paper25").by_category()
    mine = ps.by_category()
    assert "The largest planet in our solar system is" in set(mine["Factual"]) & set(p25["Factual"])
    assert "Actions speak louder than" in set(mine["Cliche"]) & set(p25["Cliche"])
    assert any(a[:60] == b[:60] for a in mine["Novel"] for b in p25["Novel"])
    assert any(a.startswith("Table sky run blue jump") for a in mine["Nonsense"])
    assert any(b.startswith("Table sky run blue jump") for b in p25["Nonsense"])


def test_flat_sets_are_all_and_input_dependency_keys_kept():
    assert set(prompts.get("high_rho_hunt_5").categories) == {"all"}
    ps = prompts.get("input_dependency_5")
    assert ps.categories == ("1_Factual", "2_Syntactic", "3_Ambiguous", "4_Nonsense", "5_Original_Test")
    assert ps[0] == "The capital of France is"


def test_aliases():
    assert prompts.aliases() == {"paper25": "grand_unified_twin_gpt2_gptj_25",
                                 "pythia25": "pythia_family_sweep_25"}
    assert prompts.get("pythia25") is prompts.get("pythia_family_sweep_25")


def test_unknown_name_lists_available():
    with pytest.raises(KeyError) as e:
        prompts.get("nope")
    assert "paper25" in str(e.value) and "high_rho_hunt_5" in str(e.value)
    with pytest.raises(TypeError):
        prompts.get(3)


def test_frozen():
    ps = prompts.get("paper25")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ps.name = "x"


def test_as_prompt_set_list_dict_name_promptset():
    ps = as_prompt_set(["a b", "c d"])
    assert ps.prompts == ("a b", "c d") and ps.categories == ("all", "all") and ps.name == "custom"
    ps = as_prompt_set(("x",), name="mine")
    assert ps.name == "mine"
    d = as_prompt_set({"Factual": ["f1", "f2"], "Nonsense": "n1"})
    assert d.categories == ("Factual", "Factual", "Nonsense")
    assert d.by_category() == {"Factual": ("f1", "f2"), "Nonsense": ("n1",)}
    assert as_prompt_set("paper25") is prompts.get("paper25")
    p = prompts.get("h4_4")
    assert as_prompt_set(p) is p
    assert as_prompt_set(p, name="renamed").prompts == p.prompts
    assert as_prompt_set(s for s in ["gen1", "gen2"]).prompts == ("gen1", "gen2")


@pytest.mark.parametrize("bad, exc", [
    ([], ValueError),
    ({}, ValueError),
    ([""], ValueError),
    (["ok", "   "], ValueError),
    (["ok", 3], TypeError),
    ([b"bytes"], TypeError),
    (b"bytes", TypeError),
    (42, TypeError),
    ({"A": []}, ValueError),
    ({"A": [1]}, TypeError),
    ({1: ["x"]}, TypeError),
    ({"A": 5}, TypeError),
    ("The capital of France is", KeyError),  # a bare string is a set name, not a prompt
])
def test_as_prompt_set_errors(bad, exc):
    with pytest.raises(exc):
        as_prompt_set(bad)


def test_promptset_validation():
    with pytest.raises(ValueError):
        PromptSet("x", ("a", "b"), ("c",))
    with pytest.raises(TypeError):
        PromptSet("x", "ab", ("a", "b"))
    with pytest.raises(TypeError):
        PromptSet("x", ("a",), (None,))
    ps = PromptSet("x", ["a"], ["c"])
    assert ps.prompts == ("a",) and isinstance(ps.categories, tuple)
    assert "n=1" in repr(ps)
