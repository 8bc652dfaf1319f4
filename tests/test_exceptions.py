"""One exception tree: every error trainvitals raises descends from TrainvitalsError."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import trainvitals
from trainvitals import exceptions

SRC = Path(trainvitals.__file__).parent


def _classes() -> list[type[BaseException]]:
    return [
        obj
        for obj in vars(exceptions).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException)
    ]


def test_every_exception_descends_from_the_root_and_is_drawn_in_the_docstring() -> None:
    doc = exceptions.__doc__ or ""
    for cls in _classes():
        assert issubclass(cls, exceptions.TrainvitalsError), cls
        assert cls.__name__ in doc, f"{cls.__name__} is missing from the tree in the docstring"
    assert set(exceptions.__all__) == {cls.__name__ for cls in _classes()}


def test_no_module_defines_an_exception_outside_the_tree() -> None:
    """An exception class declared anywhere else would start a second root."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "exceptions.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    assert offenders == []


def test_raised_builtin_errors_are_only_inside_pydantic_validators() -> None:
    """``raise ValueError`` is how a pydantic validator reports; anywhere else it is a leak."""
    offenders = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            decorators = {ast.unparse(d).split("(")[0] for d in func.decorator_list}
            validator = bool(decorators & {"field_validator", "model_validator"})
            for node in ast.walk(func):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    name = ast.unparse(node.exc.func)
                    if name in {"ValueError", "TypeError", "RuntimeError"} and not validator:
                        offenders.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
    assert offenders == []


def test_ingest_rejected_carries_its_close_code() -> None:
    error = exceptions.IngestRejected(1008, "points before hello")
    assert (error.code, error.reason) == (1008, "points before hello")
    assert isinstance(error, exceptions.ProtocolError)
