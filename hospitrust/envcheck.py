"""Checks of the environment hospitrust runs in, each one line saying what is wrong and what to do.

``hospitrust doctor`` runs them all; ``hospitrust simulate`` / ``bench`` and the ResNet models run
:func:`require_torch_pair` first, so a torch and a torchvision built for each other's wrong variant
(the same version numbers, one CPU build and one CUDA build) stop the command with one line
before Flower starts, instead of ``RuntimeError: operator torchvision::nms does not exist`` as a
traceback in every ClientApp. Only the standard library is imported at module level.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

FLOWER_SERIES = "1.42"  # the Flower release hospitrust is built and tested on
SAME_INDEX = ("reinstall both from the same index, e.g. pip install --force-reinstall torch torchvision "
              "--index-url https://download.pytorch.org/whl/cpu (or the CUDA index your GPU needs)")


class EnvironmentProblem(RuntimeError):
    """The environment cannot run hospitrust; the message is one line saying what to do."""


@dataclass(frozen=True)
class Check:
    """One check's outcome, as `hospitrust doctor` prints it."""

    name: str
    ok: bool
    detail: str  # what was found, or the problem and what to do
    required: bool = True  # False: only some commands or the tests need it


def torch_pair_problem() -> str | None:
    """None when torch and torchvision load together (torchvision's compiled operators are
    registered in torch), else one line naming the two builds and the fix.
    """
    try:
        import torch
    except Exception as exc:  # a broken torch install raises more than ImportError
        return f"torch does not import ({type(exc).__name__}: {_first_line(exc)}): pip install torch"
    try:
        import torchvision
    except Exception as exc:
        return (f"torchvision does not load with torch {torch.__version__} ({type(exc).__name__}: {_first_line(exc)}): "
                f"they come from different builds; {SAME_INDEX}")
    try:
        torch.ops.torchvision.nms  # noqa: B018 - the lookup raises when torchvision's C++ operators are missing
    except (AttributeError, RuntimeError) as exc:
        return (f"torchvision {torchvision.__version__} does not fit torch {torch.__version__} (its compiled operators "
                f"are missing: {_first_line(exc)}); {SAME_INDEX}")
    return None


def require_torch_pair() -> None:
    """Raise :class:`EnvironmentProblem` (one line) unless torch and torchvision load together."""
    problem = torch_pair_problem()
    if problem:
        raise EnvironmentProblem(problem)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def check_torch() -> Check:
    """Torch and torchvision load together; which builds they are and the GPUs torch sees."""
    problem = torch_pair_problem()
    if problem:
        return Check("torch + torchvision", False, problem)
    import torch
    import torchvision

    device = "CUDA " + str(torch.version.cuda) if torch.version.cuda else "CPU build"
    gpus = torch.cuda.device_count() if torch.version.cuda else 0
    return Check("torch + torchvision", True, f"torch {torch.__version__}, torchvision {torchvision.__version__} "
                                              f"({device}; {gpus} GPU{'s' if gpus != 1 else ''} visible); they load together")


def check_flower() -> Check:
    """Flower is the release hospitrust is built on, and its commands are on PATH."""
    try:
        version = metadata.version("flwr")
    except metadata.PackageNotFoundError:
        return Check("Flower", False, f"flwr is not installed: pip install 'flwr[simulation]=={FLOWER_SERIES}.*'")
    if version.split(".")[:2] != FLOWER_SERIES.split("."):
        return Check("Flower", False, f"flwr {version} is installed; hospitrust is built on Flower {FLOWER_SERIES}: "
                                      f"pip install 'flwr[simulation,dp]=={FLOWER_SERIES}.*'")
    missing = [cmd for cmd in ("flwr", "flower-superlink", "flower-supernode") if not _which(cmd)]
    if missing:
        return Check("Flower", False, f"flwr {version}, but {', '.join(missing)} not on PATH: activate the venv "
                                      "hospitrust is installed in")
    return Check("Flower", True, f"flwr {version}")


def _which(cmd: str) -> str | None:
    import sys

    return shutil.which(cmd) or shutil.which(cmd, path=str(Path(sys.executable).parent))


def data_folder() -> tuple[Path, str]:
    """The folder the product reads MedMNIST files from when no data-dir is given, and why that one."""
    from hospitrust.datasets.base import DATA_DIR_ENV, default_root

    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser().resolve(), f"${DATA_DIR_ENV}"
    return Path(default_root()).expanduser().resolve(), f"default; ${DATA_DIR_ENV} is unset"


def check_data() -> Check:
    """Which MedMNIST files are in the folder a run reads when no data-dir is given."""
    folder, why = data_folder()
    files = sorted(p.name for p in folder.glob("*.npz")) if folder.is_dir() else []
    if not files:
        return Check("data", False, f"no MedMNIST files in {folder} ({why}): `hospitrust simulate` downloads the "
                                    f"dataset there on its first run (network needed), or copy the .npz files there "
                                    f"or set $HOSPITRUST_DATA_DIR to a folder holding them", required=False)
    shown = ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
    return Check("data", True, f"{folder} ({why}): {shown}")


CHROMIUM_ENV, CHROMEDRIVER_ENV = "HOSPITRUST_CHROMIUM", "HOSPITRUST_CHROMEDRIVER"


def check_browser() -> Check:
    """Headless Chromium and chromedriver, which the console's browser tests drive (tests/browser.py)."""
    found = {}
    for env, default in ((CHROMIUM_ENV, "/usr/bin/chromium"), (CHROMEDRIVER_ENV, "/usr/bin/chromedriver")):
        path = os.environ.get(env, default)
        found[path] = shutil.which(path) or (path if Path(path).is_file() else None)
    missing = [path for path, hit in found.items() if not hit]
    if missing:
        return Check("browser tests", False, f"{' and '.join(missing)} not found: sudo apt-get install chromium "
                                             f"chromium-driver, or set ${CHROMIUM_ENV} / ${CHROMEDRIVER_ENV}; or run "
                                             "the tests with -m 'not browser'", required=False)
    try:
        import selenium  # noqa: F401
    except ImportError:
        return Check("browser tests", False, "Chromium is there but Selenium is not: pip install -e '.[test]'",
                     required=False)
    return Check("browser tests", True, "Chromium, chromedriver and Selenium found")


def check_extras() -> Check:
    """Which of hospitrust's extras are installed (``pip install .`` is a hospital's SuperNode; simulating,
    benchmarks, DP, figures and compressed DICOM are extras: :mod:`hospitrust.extras`).
    """
    from hospitrust.extras import EXTRAS, install_command, missing

    absent = [name for name in EXTRAS if missing(name)]
    present = [name for name in EXTRAS if name not in absent]
    if not absent:
        return Check("extras", True, f"all installed: {', '.join(present)}")
    return Check("extras", False, f"installed: {', '.join(present) or 'none'}; not installed: {', '.join(absent)} "
                                  f"(a hospital's SuperNode needs none; e.g. {install_command(','.join(absent))})",
                 required=False)


def all_checks() -> list[Check]:
    """Every check, in the order `hospitrust doctor` prints them."""
    return [check_torch(), check_flower(), check_extras(), check_data(), check_browser()]
