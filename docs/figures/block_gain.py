"""The README's figure: block gain per layer of the three embedded models, written as a small SVG.

    python docs/figures/block_gain.py          # writes docs/assets/block-gain.svg

Each point is the mean over the paper's 25 prompts of ``G = ||x_out|| / ||x_in||`` of one block
(token scope ``all_but_first``, BOS prepended, float32), with its 95% t-interval across prompts.
The SVG is drawn by hand (no browser or image library needed) and stays a few kilobytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import stats

OUT = Path(__file__).resolve().parents[1] / "assets" / "block-gain.svg"
MODELS = ("gpt2-tiny-wd", "gpt2-tiny-nowd", "neox-tiny")
COLOURS = ("#1f77b4", "#d62728", "#2ca02c")
W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 300, 70, 170, 40, 50


def measure() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """model -> (mean, ci_low, ci_high) per block, from ``tl.residual_gain`` on ``paper25``."""
    import thermo_lens as tl

    out = {}
    for name in MODELS:
        g = tl.residual_gain(tl.zoo.load(name), "paper25", token_scope="all_but_first", prepend_bos=True,
                             progress=False)
        x = g.block_gain.double().numpy()  # [prompt, layer]
        n = x.shape[0]
        mean, se = x.mean(0), x.std(0, ddof=1) / np.sqrt(n)
        half = stats.t.ppf(0.975, n - 1) * se
        out[name] = (mean, mean - half, mean + half)
    return out


def svg(data: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> str:
    """The chart: one colour per model, error bars for the 95% t-intervals, a dashed line at G = 1,
    on a log axis (the first block's gain is 10-30 times the others')."""
    n_layers = len(next(iter(data.values()))[0])
    lo = min(float(v[1].min()) for v in data.values())
    hi = max(float(v[2].max()) for v in data.values())
    lo, hi = np.log10(min(lo, 1.0)) - 0.05, np.log10(max(hi, 1.0)) + 0.05  # a log axis: G_1 is 10-30x the rest
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    X = lambda l: LEFT + pw * (l + 0.5) / n_layers  # noqa: E731
    Y = lambda v: TOP + ph * (hi - np.log10(v)) / (hi - lo)  # noqa: E731
    e = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         'font-family="sans-serif" font-size="12">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{LEFT}" y="18" font-size="13">Block gain ||x_out|| / ||x_in|| of the embedded models</text>',
         f'<text x="{LEFT}" y="32" font-size="10" fill="#555">25 prompts (paper25), token scope all_but_first, BOS; '
         'mean and 95% t-interval</text>',
         f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="black"/>',
         f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="black"/>',
         f'<line x1="{LEFT}" y1="{Y(1.0):.1f}" x2="{LEFT + pw}" y2="{Y(1.0):.1f}" stroke="#888" stroke-dasharray="4 3"/>',
         f'<text x="{LEFT + pw + 4}" y="{Y(1.0) + 4:.1f}" font-size="10" fill="#555">G = 1</text>']
    for t in (0.5, 0.8, 1, 1.25, 2, 5, 10, 20, 50, 100):
        if lo <= np.log10(t) <= hi:
            e.append(f'<text x="{LEFT - 6}" y="{Y(t) + 4:.1f}" text-anchor="end" font-size="10">{t:g}</text>')
            e.append(f'<line x1="{LEFT - 3}" y1="{Y(t):.1f}" x2="{LEFT}" y2="{Y(t):.1f}" stroke="black"/>')
    for l in range(n_layers):
        e.append(f'<text x="{X(l):.1f}" y="{TOP + ph + 16}" text-anchor="middle" font-size="10">{l}</text>')
    e.append(f'<text x="{LEFT + pw / 2:.1f}" y="{H - 10}" text-anchor="middle">layer (0-based block index)</text>')
    e.append(f'<text transform="translate(16 {TOP + ph / 2:.1f}) rotate(-90)" text-anchor="middle">block gain G (log scale)</text>')
    for k, (name, (mean, low, high)) in enumerate(data.items()):
        c, dx = COLOURS[k], (k - 1) * 6
        pts = " ".join(f"{X(l) + dx:.1f},{Y(float(v)):.1f}" for l, v in enumerate(mean))
        e.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        for l in range(n_layers):
            x = X(l) + dx
            e.append(f'<line x1="{x:.1f}" y1="{Y(float(low[l])):.1f}" x2="{x:.1f}" y2="{Y(float(high[l])):.1f}" stroke="{c}"/>')
            e.append(f'<circle cx="{x:.1f}" cy="{Y(float(mean[l])):.1f}" r="3" fill="{c}"/>')
        ly = TOP + 14 + 18 * k
        e.append(f'<line x1="{W - RIGHT + 28}" y1="{ly - 4}" x2="{W - RIGHT + 44}" y2="{ly - 4}" stroke="{c}" stroke-width="2"/>')
        e.append(f'<text x="{W - RIGHT + 48}" y="{ly}" font-size="11">{name}</text>')
    e.append("</svg>")
    return "\n".join(e) + "\n"


def main(argv: list[str] | None = None) -> None:
    out = Path((argv or sys.argv[1:] or [str(OUT)])[0])
    out.write_text(svg(measure()), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
