"""hospitrust's extras (pyproject's ``[project.optional-dependencies]``) and the check a command makes
before it needs one.

``pip install .`` is a hospital's install: what a SuperNode needs (flower-supernode, the ClientApp,
``hospitrust deploy supernode``, the launcher and its gate, ``hospitrust data check``, the data
sources). Simulating, benchmarking, differential privacy, figures and compressed DICOM are extras.
A command that needs one asks :func:`extra_problem` first and prints its line, e.g.::

    hospitrust bench: needs the 'bench' extra (not installed: ray, pandas): pip install 'hospitrust[bench]'

The distributions are looked up with :mod:`importlib.metadata` (nothing is imported), so the check
costs a few milliseconds. ``EXTRAS`` names each extra's distributions with the nested extras
expanded; ``tests/test_extras.py`` keeps it equal to pyproject.toml. Only the standard library is
imported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

PACKAGE = "hospitrust"


@dataclass(frozen=True)
class Extra:
    """One extra: its name, what it is for, and the distributions pip installs for it."""

    name: str
    purpose: str
    distributions: tuple[str, ...]  # nested extras expanded (bench holds simulation's); Flower's extras by what they add


EXTRAS: dict[str, Extra] = {e.name: e for e in (
    Extra("dicom", "compressed DICOM transfer syntaxes (JPEG, JPEG-LS, HTJ2K)",
          ("pylibjpeg", "pylibjpeg-libjpeg", "pylibjpeg-openjpeg")),
    Extra("dp", "differential privacy: local DP-SGD (Opacus) and central DP's accounting (flwr[dp])",
          ("opacus", "dp-accounting")),
    Extra("plots", "figures: `hospitrust report RUN_DIR` and a finished run's trust.png", ("matplotlib",)),
    Extra("operator", "the operator's SuperLink machine: the ServerApp's central DP and trust.png, `hospitrust report`",
          ("opacus", "dp-accounting", "matplotlib")),
    Extra("simulation", "`hospitrust simulate`: Flower's Ray simulation (flwr[simulation]), with figures",
          ("ray", "matplotlib")),
    Extra("bench", "`hospitrust bench`, `hospitrust report GRID_DIR` and the leaderboard",
          ("ray", "matplotlib", "pandas", "scipy")),
)}


def installed(distribution: str) -> bool:
    """Whether ``distribution`` is installed in this environment (by its metadata; nothing is imported).

    Parameters
    ----------
    distribution : str
        A distribution name as pip knows it, e.g. ``"ray"`` or ``"dp-accounting"``.

    Returns
    -------
    bool
        True when :func:`importlib.metadata.distribution` finds it.
    """
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def missing(extra: str, distributions: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The distributions of ``extra`` that are not installed.

    Parameters
    ----------
    extra : str
        A name of :data:`EXTRAS`.
    distributions : tuple of str, optional
        Check only these (a command that needs part of the extra: a grid's report needs the bench
        extra's tables, not Ray); default: all of the extra's.

    Returns
    -------
    tuple of str
        The missing ones, in the extra's order (empty when everything is there).
    """
    wanted = EXTRAS[extra].distributions if distributions is None else distributions
    return tuple(d for d in wanted if not installed(d))


def install_command(extra: str) -> str:
    """The pip command that adds ``extra`` to this environment's hospitrust.

    A clone installed with ``pip install -e .`` (or ``pip install .``) gets the same folder with the
    extra; otherwise the distribution's name.

    Parameters
    ----------
    extra : str
        The extra's name (or several, comma-separated).

    Returns
    -------
    str
        E.g. ``pip install 'hospitrust[bench]'`` or ``pip install -e '/home/you/hospitrust[bench]'``.
    """
    folder, editable = _installed_from()
    if folder is not None:
        return f"pip install {'-e ' if editable else ''}'{folder}[{extra}]'"
    return f"pip install '{PACKAGE}[{extra}]'"


def _installed_from() -> tuple[str | None, bool]:
    """(the local folder hospitrust was installed from, whether editably); (None, False) when unknown."""
    try:
        text = metadata.distribution(PACKAGE).read_text("direct_url.json")
        info = json.loads(text) if text else {}
    except (metadata.PackageNotFoundError, ValueError):
        return None, False
    url = urlparse(str(info.get("url", "")))
    if url.scheme != "file" or "dir_info" not in info:
        return None, False
    folder = Path(unquote(url.path))
    if not (folder / "pyproject.toml").is_file():
        return None, False
    return str(folder), bool(info["dir_info"].get("editable"))


def extra_problem(extra: str, command: str, distributions: tuple[str, ...] | None = None) -> str | None:
    """None when ``extra`` is installed, else one line for ``command`` naming the extra, what is
    missing and the pip command.

    Parameters
    ----------
    extra : str
        A name of :data:`EXTRAS`.
    command : str
        Who asks, as the line starts: ``"hospitrust bench"``, ``"privacy.mode = 'local'"``.
    distributions : tuple of str, optional
        Check only these of the extra's distributions (see :func:`missing`).

    Returns
    -------
    str or None
        E.g. ``hospitrust bench: needs the 'bench' extra (not installed: ray, pandas): pip install
        'hospitrust[bench]'``.
    """
    absent = missing(extra, distributions)
    if not absent:
        return None
    return f"{command}: needs the '{extra}' extra (not installed: {', '.join(absent)}): {install_command(extra)}"
