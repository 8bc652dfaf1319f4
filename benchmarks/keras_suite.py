"""Keras's own tests, bare and with a ``VitalsCallback`` attached to every ``fit``.

The installed ``keras`` wheel ships its tests. This runs the ones that train (the trainer,
the callbacks, the models, saving) twice against a real ``trainvitals serve``: bare, and with
``harness/keras_compat.py`` appending a callback to every ``Model.fit``. It prints every test
whose outcome differs and exits 1 when a test that passes bare does not pass attached.

    python benchmarks/keras_suite.py                  # the whole job (make compat)
    python benchmarks/keras_suite.py --json out.json  # and the outcomes, per test
    python benchmarks/keras_suite.py -k raggeds       # a part of it
    python benchmarks/keras_suite.py --bare-from out.json  # only the attached pass again

``trainer_test.py`` imports ``jax`` at module level: ``make compat`` installs the CPU wheel.
Without it that file is left out, and the report says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.processes import ROOT, ServerProcess

#: The test files that train a model, relative to the installed ``keras`` package.
SUITE = (
    "src/trainers/trainer_test.py",
    "src/trainers/epoch_iterator_test.py",
    "src/trainers/compile_utils_test.py",
    "src/callbacks/",
    "src/models/model_test.py",
    "src/models/functional_test.py",
    "src/models/sequential_test.py",
    "src/saving/saving_api_test.py",
    "src/saving/saving_lib_test.py",
)

#: Files that need a package the TensorFlow build does not bring.
NEEDS = {"src/trainers/trainer_test.py": "jax"}


def keras_root() -> Path:
    spec = importlib.util.find_spec("keras")
    assert spec is not None and spec.origin is not None, "keras is not installed"
    return Path(spec.origin).parent


def test_paths(root: Path, files: Sequence[str]) -> tuple[list[str], list[str]]:
    """The paths to run, and the files left out for a missing package."""
    paths, left_out = [], []
    for name in files:
        needed = NEEDS.get(name)
        if needed and importlib.util.find_spec(needed) is None:
            left_out.append(f"{name} (needs {needed})")
        else:
            paths.append(str(root / name))
    return paths, left_out


def run_pass(
    paths: Sequence[str], server: str, attach: bool, workdir: Path, extra: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """One pytest run over ``paths``: each test's line from the plugin, by node id."""
    out = workdir / ("attached.jsonl" if attach else "bare.jsonl")
    out.unlink(missing_ok=True)
    env = {
        **os.environ,
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TRAINVITALS_SERVER": server,
        "TRAINVITALS_COMPAT_OUT": str(out),
        "TRAINVITALS_COMPAT_ATTACH": "1" if attach else "0",
    }
    # An empty configuration file: the project's pytest settings are not Keras's.
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "harness.keras_compat",
        "-p", "no:cacheprovider",
        "-c", str(ini), "--rootdir", str(workdir), "-W", "ignore", "--no-header", "-rN",
        # remote_monitor_test.py imports the Keras repository's conftest, which the wheel
        # lacks: it fails to collect in both passes alike.
        "--continue-on-collection-errors",
        *extra, *paths,
    ]  # fmt: skip
    log = workdir / f"{'attached' if attach else 'bare'}.log"  # pytest's own output
    with log.open("w") as output:
        subprocess.run(command, env=env, cwd=workdir, check=False, stdout=output, stderr=output)
    if not out.exists():
        raise RuntimeError(f"pytest recorded no test: {' '.join(command)}")
    results = {}
    for line in out.read_text().splitlines():
        record = json.loads(line)
        results[record["test"]] = record
    return results


def compare(
    bare: dict[str, dict[str, Any]], attached: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every test whose outcome differs between the passes (a test missing from one counts)."""
    differences = []
    for test in sorted(set(bare) | set(attached)):
        before = bare.get(test, {}).get("outcome", "absent")
        after = attached.get(test, {}).get("outcome", "absent")
        if before != after:
            differences.append({"test": test, "bare": before, "attached": after})
    return differences


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the report and every outcome here")
    parser.add_argument("-k", dest="keyword", help="only the tests pytest's -k selects")
    parser.add_argument(
        "--attached-only",
        action="store_true",
        help="skip the bare pass: every selected test must pass attached",
    )
    parser.add_argument(
        "--bare-from",
        type=Path,
        help="take the bare pass from an earlier --json report (same Keras)",
    )
    parser.add_argument("-n", dest="workers", default="0", help="pytest-xdist workers")
    parser.add_argument(
        "tests", nargs="*", help="node ids or files under keras/ (default: the suite)"
    )
    args = parser.parse_args(argv)  # fmt: skip

    root = keras_root()
    if args.tests:
        paths, left_out = [str(root / t) for t in args.tests], []
    else:
        paths, left_out = test_paths(root, SUITE)
    extra = ["-k", args.keyword] if args.keyword else []
    if args.workers != "0":
        extra += ["-n", args.workers]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="keras-suite-") as tmp:
        workdir = Path(tmp)
        server = ServerProcess(str(workdir / "runs.db"))
        try:
            if args.bare_from:  # Keras's own outcomes: the agent's changes do not move them
                earlier = json.loads(args.bare_from.read_text())
                if earlier["keras"] != __import__("keras").__version__:
                    raise SystemExit(f"{args.bare_from} is of Keras {earlier['keras']}")
                bare = earlier["outcomes"]["bare"]
            elif args.attached_only:
                bare = {}
            else:
                bare = run_pass(paths, server.url, False, workdir, extra)
            attached = run_pass(paths, server.url, True, workdir, extra)
            if server.process.poll() is not None:
                raise RuntimeError(f"the server ended during the tests:\n{server.output()[-4000:]}")
            runs = len(server.get("/api/v1/runs?project=keras-compat&limit=10000")["runs"])
        finally:
            server.stop()
    if args.attached_only:
        bare = {test: {**line, "outcome": "passed"} for test, line in attached.items()}
    differences = compare(bare, attached)
    broken = [d for d in differences if d["bare"] == "passed"]
    report = {
        "keras": __import__("keras").__version__,
        "left_out": left_out,
        "bare": dict(Counter(r["outcome"] for r in bare.values())),
        "attached": dict(Counter(r["outcome"] for r in attached.values())),
        "fits_attached": sum(r["fits"] for r in attached.values()),
        "runs_on_server": runs,
        "differences": differences,
        "warned": {t: r["warnings"] for t, r in attached.items() if r["warnings"]},
        "seconds": round(time.monotonic() - began, 1),
    }
    for difference in differences:
        print(f"DIFFERS {difference['test']}: bare {difference['bare']}, "
              f"attached {difference['attached']}")  # fmt: skip
    for name in left_out:
        print(f"left out: {name}")
    print(
        f"keras {report['keras']}: bare {report['bare']}, attached {report['attached']}; "
        f"{report['fits_attached']} fits with the callback; {len(differences)} differences, "
        f"{len(broken)} broken by the callback; {report['seconds']} s"
    )
    if args.json:
        report["outcomes"] = {"bare": bare, "attached": attached}
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
