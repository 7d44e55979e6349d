"""Every mutant of mutation_check.py still finds the code it breaks: a refactor that moves that code leaves the
mutant aimed at nothing (two were, after the planner's rewrite), and mutation_check then refuses to run at all."""

import pytest

from tests import mutation_check


@pytest.mark.parametrize("m", mutation_check.MUTANTS, ids=lambda m: m.name)
def test_mutant_target_occurs_once(m):
    assert mutation_check.occurrences(m) == 1, f"update mutant {m.name}"


def test_every_mutant_names_tests_that_exist():
    """A mutant whose tests moved or were renamed would run nothing and look killed: pytest fails on a missing
    path, so every file and test function it names must be there."""
    missing = []
    for m in mutation_check.MUTANTS:
        for t in m.tests:
            path, _, func = t.partition("::")
            f = mutation_check.ROOT / path
            if not f.is_file() or (func and f"def {func.split('[')[0]}(" not in f.read_text()):
                missing.append(f"{m.name}: {t}")
    assert not missing, missing
