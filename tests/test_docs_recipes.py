"""Every YAML block of docs/recipes.md is a valid search space that resolves to its recipe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raysearch.spaces import load_space

DOC = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
BLOCKS = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_its_three_recipes():
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: yaml.safe_load(b)["method"])
def test_recipe_is_a_valid_space(block, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(block)
    space = load_space(path)
    doc = yaml.safe_load(block)
    fixed = {k: v for k, v in doc["train"].items() if not isinstance(v, dict)}
    sampled = {f"{k}": v["low"] if "low" in v else v["choices"][0]
               for k, v in {**doc.get("params", {}), **doc["train"]}.items()
               if isinstance(v, dict)}
    config = space.resolve({"method": doc["method"], **sampled})
    for key, value in fixed.items():  # each fixed training key reached its section's field
        got = getattr(config, key)
        if key in ("model", "optimizer", "schedule"):  # sections now: their name
            got = got.name
        assert got == value, key
