"""Fuzzing tensorbridge's readers: targets, bounds, structure-aware mutators, a CLI.

Like ``benchmarks/``, this lives in the repository, not in the installed package.
``python -m fuzz --help``; docs/dev/fuzzing.md says what is fuzzed and how it is judged.
"""
