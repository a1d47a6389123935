"""What is generated from the components' Options, by one command, and checked by a test:

- pyproject.toml's ``[tool.flwr.app.config]`` and its sections (Flower refuses a ``--run-config``
  key that pyproject does not declare, so it must declare every component's options);
- ``docs/config.md``, the config reference (every key, its default and meaning, and each old
  flat key's new name);
- the options table of every rule's page (``docs/rules/<rule>.md``, between its markers), and
  the values table of every preset's page (``docs/rules/<preset>.md``, between its ``preset``
  markers): a published form or an ablation, as its preset sets it.

``hospitrust config generate`` writes them; ``hospitrust config check`` exits 1 when one is stale.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

from hospitrust.config import legacy
from hospitrust.config.run import CoreOptions
from hospitrust.config.sections import Section, all_sections
from hospitrust.options import Options, kebab
from hospitrust.strategies.preset import Preset
from hospitrust.strategies.registry import PRESETS, STRATEGIES

BANNER = ("# The run config, generated from the components' Options by `hospitrust config generate`:\n"
          "# edit the Options (beside each component's class), then regenerate. docs/config.md explains every key.")
MARKER = re.compile(r"(<!-- options:begin (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- options:end -->)", re.S)
PRESET_MARKER = re.compile(r"(<!-- preset:begin (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- preset:end -->)", re.S)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def _table(header: str, options: type[Options], prefix: str = "") -> list[str]:
    lines = [f"[{header}]"]
    nested: list[tuple[str, type[Options]]] = []
    defaults = options()
    for name, info in options.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, Options):
            nested.append((kebab(name), sub))
            continue
        lines.append(f"{kebab(name)} = {toml_value(getattr(defaults, name))}")
    out = lines
    for key, sub in nested:
        out += ["", *_table(f"{header}.{key}", sub)]
    return out


def pyproject_config() -> str:
    """The ``[tool.flwr.app.config]`` tables, as pyproject holds them."""
    lines = [BANNER, *_table("tool.flwr.app.config", CoreOptions)]
    for name, section in all_sections().items():
        lines += ["", *_table(f"tool.flwr.app.config.{name}", section.options)]
    return "\n".join(lines) + "\n"


def render_pyproject(text: str) -> str:
    """``text`` (a pyproject.toml) with its run-config tables replaced by the generated ones."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.strip() == "[tool.flwr.app.config]"), None)
    if start is None:
        raise ValueError("pyproject.toml has no [tool.flwr.app.config] table")
    while start > 0 and lines[start - 1].startswith("# "):  # the banner above the table
        start -= 1
    end = start + 1
    while end < len(lines):
        stripped = lines[end].strip()
        if stripped.startswith("[") and not stripped.startswith("[tool.flwr.app.config"):
            break
        end += 1
    return "".join(lines[:start]) + pyproject_config() + "\n" + "".join(lines[end:]).lstrip("\n")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def options_table(section: Section | None, options: type[Options], prefix: str) -> list[str]:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    defaults = options().to_flat()
    for key, (model, field) in options.flat_fields().items():
        info = model.model_fields[field]
        rows.append(f"| `{prefix}{key}` | `{toml_value(defaults[key])}` | {_cell(info.description or '')} |")
    return rows


def config_markdown() -> str:
    """docs/config.md."""
    sections = all_sections()
    out = [
        "# The run config",
        "",
        "Generated from the components' Options by `hospitrust config generate` (a test fails when it is stale).",
        "",
        "Set keys in `pyproject.toml`'s `[tool.flwr.app.config]`, or per run with `hospitrust simulate -c 'key=value ...'`",
        "or `flwr run --run-config`. A component's options are a section named after it: `[tool.flwr.app.config.hta]`",
        "holds HTA's options, which Flower flattens to `hta.ema-rate`; on the command line write the dotted key",
        "(`-c 'strategy=\"hta\" hta.exclusion-fraction=0.4'`). A section's keys count only when its component is",
        "selected (the strategy, the partitioner, the attack, and what they compose: EARN's HTA base, Sybil's base",
        "attack; a pre-aggregation step's section when `pre-aggregation` names it); set for another component they",
        "are refused with the selected one named. The service sections (the run's parts and the round features'",
        f"own: {', '.join(f'`{name}`' for name, s in sections.items() if s.kind == 'service')}) are always in effect.",
        "An `ablation` sub-section holds toggles that bring back an earlier, worse-measured form of a rule: never the",
        "default; the rule's page has the measurement.",
        "",
        "## Top-level keys",
        "",
        *options_table(None, CoreOptions, ""),
    ]
    titles = {"service": "Services", "strategy": "Aggregation rules", "partitioner": "Partitioners", "attack": "Attacks",
              "pre-aggregator": "Pre-aggregation steps"}
    for kind, title in titles.items():
        out += ["", f"## {title}"]
        for name, section in sections.items():
            if section.kind != kind:
                continue
            out += ["", f"### `{name}`", "", f"{section.summary} ([{section.doc}]({section.doc}))", "",
                    *options_table(section, section.options, f"{name}.")]
    out += ["", "## Presets", "",
            "A published form or an ablation is a preset: `strategy = \"<preset>\"` selects its rule with the values",
            "below, over the rule's section (it has no section of its own). A value set in the rule's section other than",
            "the rule's default overrides the preset's, with a warning; one equal to the rule's default cannot be told",
            "from unset (Flower passes every default) and is refused where the keys set are known (`hospitrust simulate",
            "-c`, bench grids). Each preset's page has its table with the reasons.", "",
            "| strategy | rule | values | what |", "|---|---|---|---|"]
    out += [f"| `{name}` | `{p.rule.name}` | {', '.join(f'`{p.rule.name}.{k}` = `{toml_value(v)}`' for k, v in p.values.items())} "
            f"| {_cell(p.summary.split('. ')[0].rstrip('.'))}. ([rules/{name}.md](rules/{name}.md)) |"
            for name, p in PRESETS.items()]
    out += ["", "## Old flat keys", "",
            "hospitrust 0.1 had one flat list of keys. Wherever hospitrust reads a config (`hospitrust simulate -c`,",
            "grid files, `cells.csv`, `config.json`, checkpoints) an old key is translated with a deprecation line;",
            "plain `flwr run --run-config` takes only the new names.", "",
            "| old key | new key |", "|---|---|"]
    out += [f"| `{old}` | `{new}` |" for old, new in legacy.old_key_table()]
    return "\n".join(out) + "\n"


def preset_table(preset: Preset) -> list[str]:
    """A preset's values beside its rule's defaults, with why (the preset's own settings first)."""
    rule = preset.rule.name
    defaults = preset.rule.Options.defaults_flat()
    module = inspect.getmodule(preset.rule)
    where = f"`{module.__name__.replace('.', '/')}.py`" if module is not None else "its rule's module"
    rows = [f"`strategy = \"{preset.name}\"` is [`{rule}`]({rule}.md) with these values (the preset in {where}); every "
            f"other key is `{rule}`'s, from its section. A value set there other than `{rule}`'s default overrides the "
            "preset's, with a warning.", "",
            f"| key | value | `{rule}`'s default | why |", "|---|---|---|---|"]
    keys = sorted(preset.settings, key=lambda k: (k not in preset.own, list(preset.settings).index(k)))
    for key in keys:
        value, why = preset.settings[key]
        if key not in preset.own:
            why = f"{why.rstrip('.')} (as `{preset.extends}`)."
        rows.append(f"| `{rule}.{key}` | `{toml_value(value)}` | `{toml_value(defaults[key])}` | {_cell(why)} |")
    return rows


def rule_options_block(name: str) -> str:
    sections = all_sections()
    if name in PRESETS:
        return "\n".join(preset_table(PRESETS[name])) + "\n"
    if name in sections:
        return "\n".join(options_table(sections[name], sections[name].options, f"{name}.")) + "\n"
    if name in STRATEGIES:
        return "No options of its own (the top-level keys apply, e.g. `assumed-malicious` for the rules sized for f).\n"
    return f"(no component named {name!r})\n"


def render_rule_page(text: str) -> str:
    text = MARKER.sub(lambda m: m.group(1) + rule_options_block(m.group("name")) + m.group(4), text)
    return PRESET_MARKER.sub(lambda m: m.group(1) + rule_options_block(m.group("name")) + m.group(4), text)


def targets(root: Path) -> dict[Path, str]:
    """Every generated file under the project ``root`` and the text it should have."""
    out = {root / "pyproject.toml": render_pyproject((root / "pyproject.toml").read_text()),
           root / "docs" / "config.md": config_markdown()}
    for page in sorted((root / "docs" / "rules").glob("*.md")):
        out[page] = render_rule_page(page.read_text())
    return out


def stale(root: Path) -> list[Path]:
    """The generated files that differ from what the Options give."""
    return [path for path, text in targets(root).items() if not path.is_file() or path.read_text() != text]


def generate(root: Path) -> list[Path]:
    """Write every generated file; returns those that changed."""
    changed = []
    for path, text in targets(root).items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    return changed
