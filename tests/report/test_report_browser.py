"""Open the report in real headless Chromium at 800, 1,024 and 1,400 px wide: every figure renders,
the circuitsvis panel renders, no JavaScript error, no network request, no sideways scrolling; and
a screenshot is taken (at 1,400 px).

A probe script injected into a copy of the report records ``error`` events (scripts and resource
loads, captured) and unhandled rejections; after ``load`` it counts the ``.js-plotly-plot``
elements that drew an SVG/canvas, the circuitsvis containers that rendered, and every resource
fetched over http(s), and writes the status into ``document.title``, read back with
``chromium --headless --dump-dom`` (the same run takes the screenshot). Name resolution is disabled in the browser
(``--host-resolver-rules``), so a network reference could not load even if one slipped in.

Skipped only when no Chromium binary exists and ``CI`` is not set (in CI it must run).
"""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from test_report import build_profiles

from thermo_lens.report import render_report

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "/usr/bin/chromium")

_PROBE = """<script>window.__tlErrors=[];
window.addEventListener('error',function(e){var t=e.target;window.__tlErrors.push(
  (t&&t!==window&&(t.src||t.href))?('resource '+(t.src||t.href)):String(e.message||e));},true);
window.addEventListener('unhandledrejection',function(e){window.__tlErrors.push('rejection: '+String(e.reason));});
</script>"""

_STATUS = """<script>window.addEventListener('load',function(){setTimeout(function(){
var plots=document.querySelectorAll('.js-plotly-plot'),ok=0;
plots.forEach(function(p){if(p.querySelector('svg.main-svg')||p.querySelector('canvas'))ok++;});
var cv=document.querySelectorAll('.thermo-lens-circuitsvis'),cvok=0;
cv.forEach(function(d){if(d.querySelector('canvas,svg,div'))cvok++;});
var net=performance.getEntriesByType('resource').filter(function(r){return /^https?:/.test(r.name);}).length;
var de=document.documentElement;
document.title='TLSTATUS plots='+plots.length+' rendered='+ok+' cv='+cv.length+' cvok='+cvok+
 ' net='+net+' sw='+de.scrollWidth+' cw='+de.clientWidth+' errors='+window.__tlErrors.length+' :: '+
 window.__tlErrors.join(' | ');},2000);});</script>"""


def _chromium() -> str | None:
    for c in _CANDIDATES:
        path = shutil.which(c) or (c if os.path.isabs(c) and os.access(c, os.X_OK) else None)
        if path:
            return path
    return None


def _run(binary: str, profile_dir: str, *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
             "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={profile_dir}",
             "--virtual-time-budget=20000"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def chromium():
    binary = _chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but no Chromium binary was found (install the Debian package 'chromium')")
        pytest.skip("no Chromium binary (chromium / chromium-browser / google-chrome) on PATH; "
                    "install the Debian package 'chromium' to run the browser test")
    return binary


@pytest.mark.browser
@pytest.mark.slow
def test_report_renders_in_headless_chromium(chromium, bridge, checkpoint_dir, tmp_path):
    profiles = build_profiles(bridge, checkpoint_dir)
    page, ids = render_report(profiles, panel=bridge("gpt2"))  # with the circuitsvis panel
    probed = tmp_path / "probe.html"
    probed.write_text(page.replace("<head>", "<head>\n" + _PROBE, 1).replace("</body>", _STATUS + "</body>", 1),
                      encoding="utf-8")
    shot = tmp_path / "report.png"
    for width in (800, 1024, 1400):  # one browser run per width: DOM status (and at 1,400 px a screenshot)
        with tempfile.TemporaryDirectory() as prof:
            dom = _run(chromium, prof, "--dump-dom", f"--window-size={width},4000",
                       *([f"--screenshot={shot}"] if width == 1400 else []), probed.as_uri())
        m = re.search(r"<title>TLSTATUS ([^<]*)</title>", dom.stdout)
        assert m, f"no status from the page at {width} px (chromium rc={dom.returncode}): {dom.stderr[-2000:]}"
        status = dict(re.findall(r"(\w+)=(\d+)", m.group(1).split(" :: ")[0]))
        errors = m.group(1).split(" :: ", 1)[1]
        assert int(status["errors"]) == 0, f"JavaScript errors in the report at {width} px: {errors}"
        assert int(status["plots"]) == len(ids) > 15
        assert int(status["rendered"]) == len(ids), f"only {status['rendered']} of {len(ids)} figures drew"
        assert int(status["cv"]) == 1 and int(status["cvok"]) == 1, "the circuitsvis panel did not render"
        assert int(status["net"]) == 0, "the report fetched something over the network"
        assert int(status["sw"]) <= int(status["cw"]) <= width, f"the page scrolls sideways at {width} px: {status}"

    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # a blank page is a few kB
    keep = os.environ.get("THERMO_LENS_SCREENSHOT")
    if keep:  # for a human look: THERMO_LENS_SCREENSHOT=/tmp/report.png pytest ...
        Path(keep).write_bytes(shot.read_bytes())
