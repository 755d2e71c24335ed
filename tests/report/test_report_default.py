"""The default report as a newcomer reads it (issue 25): no raw HTML shown as text, one BOS
definition (a note, not an alarm, when "host" resolves per model), an L* section that explains
shallow models, families filled in, one name for the prompt set, definitions embedded, and the
laws on the paper's table plus the user's models said plainly."""

import dataclasses
import html
import re

import pytest
from study_helpers import template

from thermo_lens import report, zoo
from thermo_lens.experiments import study
from thermo_lens.views import markdown, sections


def _relabel(name, **meta):
    base = template()
    return dataclasses.replace(base, meta={**base.meta, "name": name, **meta})


def _defaults():
    """Three profiles shaped like the default run: BOS "host" resolved True, True, False."""
    return {n: _relabel(n, prepend_bos=bos, prepend_bos_requested="host", lab="thermo-lens zoo",
                        family=zoo.family(n), prompt_set="grand_unified_twin_gpt2_gptj_25")
            for n, bos in (("gpt2-tiny-wd", True), ("gpt2-tiny-nowd", True), ("neox-tiny", False))}


def test_zoo_models_have_a_family_in_specs_and_rows():
    assert zoo.family("gpt2-tiny-wd") == "gpt2" and zoo.family("neox-tiny") == "gpt-neox"
    assert study.model_from_name("neox-tiny").family == "gpt-neox"
    assert study.ModelSpec(id="a", zoo="gpt2-tiny-nowd").family == "gpt2"
    assert study.ModelSpec(id="a", zoo="gpt2-tiny-nowd", family="mine").family == "mine"  # a given one wins


def test_prompt_set_label_names_alias_and_set():
    assert report.prompt_set_label("paper25") == "paper25 (grand_unified_twin_gpt2_gptj_25)"
    assert report.prompt_set_label("grand_unified_twin_gpt2_gptj_25") == "paper25 (grand_unified_twin_gpt2_gptj_25)"
    assert report.prompt_set_label("custom") == "custom" and report.prompt_set_label(None) == ""


def test_bos_resolved_per_model_from_host_is_a_note_not_a_warning():
    profiles = _defaults()
    _, warns = report._settings_table(profiles)
    assert not any("prepend_bos" in w for w in warns)
    note = report._bos_note(profiles)
    assert "BOS prepended for gpt2-tiny-wd, gpt2-tiny-nowd" in note and "no BOS for neox-tiny" in note
    assert "--prepend-bos true" in note
    # Asked for different modes: that is two definitions, and still a warning.
    mixed = {**profiles, "neox-tiny": _relabel("neox-tiny", prepend_bos=False, prepend_bos_requested=False)}
    _, warns = report._settings_table(mixed)
    assert any("different prepend_bos" in w for w in warns) and report._bos_note(mixed) is None


def test_shallow_l_star_is_explained():
    lstar = template().l_star
    assert lstar.predicted > lstar.n_layers  # a 4-block zoo model: eq. 6 points past the last block
    text = sections.shallow_l_star_text({"gpt2-tiny-wd": lstar})
    assert f"eq. 6 gives {lstar.predicted:.3g}" in text and "no prediction to test" in text
    assert "12 or more blocks" in text


def test_markdown_page_converts_and_escapes():
    out = markdown.to_html("# Title\n\nA `x<y` and **bold** <b>raw</b>.\n\n- one\n  more\n- two\n\n"
                           "| a | b |\n| --- | --- |\n| `1\\|2` | 3 |\n<!-- hidden -->\n```\ncode <here>\n```\n")
    assert "<h3 id='def-title'>Title</h3>" in out
    assert "<code>x&lt;y</code>" in out and "<strong>bold</strong>" in out and "&lt;b&gt;raw&lt;/b&gt;" in out
    assert "<li>one more</li><li>two</li>" in out
    assert "<td><code>1|2</code></td><td>3</td>" in out
    assert "hidden" not in out and "<pre>code &lt;here&gt;</pre>" in out


@pytest.mark.slow  # renders a whole report (seconds)
def test_default_like_report_reads_cleanly():
    page, _ = report.render_report(_defaults(), panel=False)
    visible = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    text = html.unescape(visible)
    assert "&lt;a href" not in visible  # no HTML shown as text
    assert '<a href="#definitions">Definitions</a>.' in visible
    assert "different prepend_bos" not in text and "prepend_bos='host'" in text
    # L*: explained, no table of warnings for models eq. 6 cannot describe
    assert "no prediction to test" in visible and "outside the network" not in visible
    # families filled in, the prompt set named one way
    assert "<td class=\"l\">gpt-neox</td>" in visible
    assert "paper25 (grand_unified_twin_gpt2_gptj_25)" in visible
    # definitions embedded: the page itself, no link to a file of the installed package
    assert "file://" not in visible and "What thermo-lens measures, exactly" in visible
    # the laws on the paper's table plus these models, said plainly
    assert "the paper's 8 Pythia models plus your 3" in text
    assert "Your models added to the paper's published tables" in text and "KleiberResult(n=11" in text
    # the same numbers as the documented route, paper.findings.law_results(extra=...)
    from thermo_lens.paper import findings

    rows = report._rows(_defaults())
    extra = rows[["model", "lab", "n_layers", "n_heads", "d_head", "rho", "gain", "n_prompts"]].assign(
        std=rows["gain_sd"], std_ddof=1)
    expected = findings.law_results(extra=extra)
    for key in ("kleiber", "heritage", "hierarchy"):
        assert expected[key].summary() in text, key
