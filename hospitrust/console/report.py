"""``hospitrust report RUN_DIR``: the console's page for one run as one self-contained HTML file
(its script, styles, uPlot and the run's data inlined: it opens offline, from a file), plus the
PNG figures (metrics per round, trust per hospital).
"""

from __future__ import annotations

import json
from pathlib import Path

from hospitrust.console.app import STATIC, round_rows, run_state
from hospitrust.console.runs import RunReader
from hospitrust.server_app.plots import plot_metrics, plot_trust


def _script_safe(text: str) -> str:
    return text.replace("</", "<\\/")  # no "</script>" inside an inline script


def report_html(reader: RunReader) -> str:
    """The console page with everything it loads inlined and the run's data embedded."""
    data = {
        "root": str(reader.path),
        "runs": [reader.row()],
        "states": {reader.id: run_state(reader, 0)},
        "rounds": {reader.id: {str(r): round_rows(reader, r) for r in range(1, len(reader.rounds) + 1)}},
    }
    page = (STATIC / "console.html").read_text()
    inline = {
        '<link rel="stylesheet" href="static/vendor/uplot/uPlot.min.css">':
            f"<style>{(STATIC / 'vendor/uplot/uPlot.min.css').read_text()}</style>",
        '<link rel="stylesheet" href="static/console.css">': f"<style>{(STATIC / 'console.css').read_text()}</style>",
        '<script src="static/vendor/uplot/uPlot.iife.min.js"></script>':
            f"<script>{_script_safe((STATIC / 'vendor/uplot/uPlot.iife.min.js').read_text())}</script>",
        '<script src="static/console.js"></script>':
            f"<script>window.HOSPITRUST_REPORT = {_script_safe(json.dumps(data, allow_nan=False, default=str))};</script>\n"
            f"<script>{_script_safe((STATIC / 'console.js').read_text())}</script>",
    }
    for tag, replacement in inline.items():
        if tag not in page:
            raise RuntimeError(f"console.html lacks {tag!r}")
        page = page.replace(tag, replacement)
    return page.replace("<title>hospitrust console</title>", f"<title>hospitrust report: {reader.path.name}</title>")


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write ``report.html``, ``metrics.png`` and ``trust.png`` into ``out_dir`` (default RUN_DIR/report)."""
    run_dir = Path(run_dir).expanduser().resolve()
    reader = RunReader(run_dir, run_dir.name)
    reader.refresh()
    if not reader.rounds:
        raise ValueError(f"{run_dir}: rounds.jsonl has no rounds yet")
    out = Path(out_dir).expanduser().resolve() if out_dir else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    html = out / "report.html"
    html.write_text(report_html(reader))
    written = [html, plot_metrics(run_dir, out / "metrics.png")]
    try:
        written.append(plot_trust(run_dir, out / "trust.png"))
    except ValueError:  # a rule that records no per-hospital signal (and no weights)
        pass
    return written
