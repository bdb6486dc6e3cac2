"""python -m sandbox.eval says what it leaves out: the anti-hack rules, and a task's CPU_SIZES."""
from sandbox.eval import scope_notes


def test_notes_name_the_rules_and_cpu_sizes():
    notes = scope_notes("CPU_SIZES = {'N': 4}\nN = 1024\n")
    assert any("anti-hack rules are not applied" in n for n in notes)
    assert any("CPU_SIZES are ignored" in n for n in notes)
    assert not any("CPU_SIZES" in n for n in scope_notes("N = 1024\n"))
