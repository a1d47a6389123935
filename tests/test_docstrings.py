"""The public math and strategy API documents every parameter (numpy convention).

ruff's pydocstyle checks the shape of docstrings that exist; this checks the part it cannot:
that every public function or class taking arguments in the documented packages has a
``Parameters`` section.
"""

import importlib
import inspect
import pkgutil

import pydantic

DOCUMENTED = ["hospitrust.aggregation", "hospitrust.attacks", "hospitrust.contribution", "hospitrust.strategies", "hospitrust.fbd"]


def _public_callables():
    for pkg_name in DOCUMENTED:
        pkg = importlib.import_module(pkg_name)
        modules = [pkg] + [importlib.import_module(f"{pkg_name}.{m.name}") for m in pkgutil.walk_packages(pkg.__path__) if not m.name.startswith("_")]
        for mod in modules:
            for name, obj in vars(mod).items():
                if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                    continue
                if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                    continue
                if inspect.isclass(obj) and (obj.__init__ is object.__init__ or issubclass(obj, pydantic.BaseModel)):
                    continue  # options models document their fields with Field(description=...)
                target = obj.__init__ if inspect.isclass(obj) else obj
                try:
                    params = [p for p in inspect.signature(target).parameters if p not in ("self", "cls", "args", "kwargs")]
                except (TypeError, ValueError):
                    continue
                if params:
                    yield f"{mod.__name__}.{name}", obj


def test_public_api_documents_its_parameters():
    found = list(_public_callables())
    assert len(found) > 150, "the walk found too little: the package layout changed?"
    missing = [name for name, obj in found if "Parameters\n----------" not in (inspect.getdoc(obj) or "")]
    assert not missing, "public callables without a Parameters section:\n" + "\n".join(missing)
