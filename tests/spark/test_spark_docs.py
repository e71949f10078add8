"""docs/spark.md's examples run as written: every name they use is imported or defined (a reader copying the
estimator example got ``NameError: TorchModel``), and the ``run`` example sets the executors' Python."""

import ast
import builtins
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"
# What the examples leave to the reader on purpose: the user's network, optimizer and DataFrames.
PLACEHOLDERS = {"net", "model", "optimizer", "train_df", "test_df"}


def python_blocks():
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def bound_and_used(tree):
    bound, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return bound, used


def test_every_name_in_the_examples_is_imported_or_defined():
    known = set(dir(builtins)) | PLACEHOLDERS
    blocks = python_blocks()
    assert len(blocks) >= 3
    for block in blocks:  # each block may use what the blocks before it defined, as a reader's session would
        bound, used = bound_and_used(ast.parse(block))
        known |= bound
        assert used <= known, f"undefined in docs/spark.md's example: {sorted(used - known)}\n{block}"


def test_the_run_example_sets_the_executors_python_before_the_session():
    run_block = next(b for b in python_blocks() if "horovod.spark.run(" in b)
    assert "PYSPARK_PYTHON" in run_block
    assert run_block.index("PYSPARK_PYTHON") < run_block.index("getOrCreate")
