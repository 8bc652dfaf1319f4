"""What the tests and the benchmarks share: real servers, real training processes, memory
cgroups and the scenario suite's outcomes. Part of the source tree, not of the package users
install; ``tests/`` and ``benchmarks/`` import it from the repository root."""
